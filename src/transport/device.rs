//! placeholder
#[derive(Debug)]
pub(crate) struct DeviceState;
