//! NVIDIA's NVLink links, from NVML (`libnvidia-ml.so.1`, part of the driver), loaded
//! at run time with `dlopen`: HALO builds and discovers without an NVIDIA driver.
//!
//! For each GPU NVML lists (`nvmlDeviceGetCount_v2`, `nvmlDeviceGetHandleByIndex_v2`,
//! its PCI bus id from `nvmlDeviceGetPciInfo_v3`), each of its links `0..18`
//! (`NVML_NVLINK_MAX_LINKS`; `NVML_ERROR_INVALID_ARGUMENT` past the GPU's last link ends
//! the walk, `NVML_ERROR_NOT_SUPPORTED` is a link that is not there) is read:
//! `nvmlDeviceGetNvLinkState` (only active links count), what is at its far end
//! (`nvmlDeviceGetNvLinkRemoteDeviceType`: GPU, IBM NPU or NVSwitch; where the driver
//! lacks the call, a far end whose bus id is a GPU NVML lists is that GPU) and the far
//! end's PCI bus id (`nvmlDeviceGetNvLinkRemotePciInfo_v2`). Bus ids are normalised as
//! the rest of discovery writes them: lower-case `dddd:bb:dd.f` (NVML writes
//! `00000000:18:00.0`).
//!
//! From these, [`nvlink_pairs`] (pure, tested without NVML) makes one
//! [`GpuLink`] per ordered GPU pair:
//!
//! - **Direct links** (the far end is a GPU): the number of active links from the one GPU
//!   that end on the other.
//! - **NVSwitch** (DGX / HGX A100, H100, H200: every link of a GPU ends on a switch):
//!   the switches are taken as one node that joins every GPU whose links end on them, as
//!   NCCL's topology does (its NVS node), so each ordered pair of such GPUs gets
//!   `min(switch links of the two)` links: what the slower of them can put through the
//!   switches. On a DGX H100 that is 18 links between each of the 56 ordered pairs.
//! - Links to an IBM NPU (a POWER9 CPU), and links whose far end is no GPU NVML lists
//!   and no switch, are left out: they join no two GPUs of this machine.
//!
//! NVML reports no per-link rate. The rate is taken from the GPU's CUDA compute
//! capability (`nvmlDeviceGetCudaComputeCapability`), as NCCL keys its NVLink bandwidth
//! on it; see [`link_rate`]. Where it is not known the bandwidth is 0. NVML reports no
//! cost either: the weight is 0.
//!
//! Failures are never discovery errors: a library that does not load or an
//! `nvmlInit_v2` that fails (no driver, no GPU) makes NVML *unavailable*, a later call
//! that fails makes it *failed*; either leaves the NVLink links out and says why,
//! naming the function and NVML's `nvmlErrorString`, in the discovery's sources.
//!
//! The pure part and the loader's errors are tested here; the walk over the real
//! library runs only on a machine with NVML and is verified there, not in CI.

use std::collections::BTreeMap;
use std::ffi::{CStr, OsString, c_char, c_int, c_uint, c_void};
use std::path::Path;

use libloading::Library;

use super::{GpuLink, GpuLinkKind};

/// The library names tried, in order, when no path is given.
pub(super) const LIBRARY_NAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// `NVML_NVLINK_MAX_LINKS` of `nvml.h`: links looked at per GPU.
const MAX_LINKS: c_uint = 18;

/// `NVML_SUCCESS`.
const SUCCESS: c_uint = 0;
/// `NVML_ERROR_INVALID_ARGUMENT`: for a link, an index past the GPU's last link.
const ERROR_INVALID_ARGUMENT: c_uint = 2;
/// `NVML_ERROR_NOT_SUPPORTED`.
const ERROR_NOT_SUPPORTED: c_uint = 3;
/// `NVML_FEATURE_ENABLED` of `nvmlEnableState_t`.
const FEATURE_ENABLED: c_uint = 1;

/// What is at the far end of an NVLink (`nvmlIntNvLinkDeviceType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Remote {
    /// `NVML_NVLINK_DEVICE_TYPE_GPU` (0).
    Gpu,
    /// `NVML_NVLINK_DEVICE_TYPE_IBMNPU` (1): a POWER9 CPU.
    IbmNpu,
    /// `NVML_NVLINK_DEVICE_TYPE_SWITCH` (2): an NVSwitch.
    Switch,
    /// Another value (`NVML_NVLINK_DEVICE_TYPE_UNKNOWN` is 0xff).
    Other(u32),
    /// The driver has no `nvmlDeviceGetNvLinkRemoteDeviceType`, or does not support it
    /// for this link: a GPU when the far end's bus id is one.
    NotReported,
}

impl Remote {
    fn from_nvml(value: c_uint) -> Remote {
        match value {
            0 => Remote::Gpu,
            1 => Remote::IbmNpu,
            2 => Remote::Switch,
            other => Remote::Other(other),
        }
    }
}

/// One NVLink of a GPU, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LinkReport {
    /// `nvmlDeviceGetNvLinkState` is `NVML_FEATURE_ENABLED`.
    pub(super) active: bool,
    /// What is at its far end.
    pub(super) remote: Remote,
    /// The far end's PCI bus id, normalised; `None` when NVML does not give it.
    pub(super) remote_bus_id: Option<String>,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeviceReport {
    /// Its PCI bus id, normalised.
    pub(super) bus_id: String,
    /// Bytes per second one of its links carries one way ([`link_rate`]); `None` when
    /// not known.
    pub(super) link_rate: Option<u64>,
    /// Its links, by index.
    pub(super) links: Vec<LinkReport>,
}

/// Bytes per second one NVLink carries in one direction, by the GPU's CUDA compute
/// capability; `None` for a generation not listed.
///
/// NVIDIA's data sheets give each GPU's NVLink bandwidth as the total of both
/// directions over all links; one link one way is that / links / 2:
///
/// | compute capability | GPU | NVLink | data sheet | per link, one way |
/// |---|---|---|---|---|
/// | 6.0 | P100 | 1 | 160 GB/s, 4 links | 20 GB/s |
/// | 7.x | V100 (7.0), Turing NVLink bridges (7.5) | 2 | V100: 300 GB/s, 6 links | 25 GB/s |
/// | 8.0 | A100 | 3 | 600 GB/s, 12 links | 25 GB/s |
/// | 9.0 | H100, H200 | 4 | 900 GB/s, 18 links | 25 GB/s |
/// | 10.x | B200, B300 | 5 | 1.8 TB/s, 18 links | 50 GB/s |
///
/// Others (8.6 and 8.9 bridges, where the figure per link is not published the same
/// way) are not guessed. `nvmlDeviceGetNvLinkVersion` is not used: its values are
/// offset from the NVLink generation (`NVML_NVLINK_VERSION_4_0` is 6), and public tools
/// work around Hopper GPUs that report the 5.0 value.
pub(super) fn link_rate(major: i32, minor: i32) -> Option<u64> {
    const GB: u64 = 1_000_000_000;
    match (major, minor) {
        (6, 0) => Some(20 * GB),
        (7, _) | (8, 0) | (9, 0) => Some(25 * GB),
        (10, _) => Some(50 * GB),
        _ => None,
    }
}

/// The NVLink pairs of GPUs, one entry per direction, by (from, to) bus id (rules in
/// the module doc). Inactive links, links to IBM NPUs and links whose far end is no GPU
/// of `devices` and no switch are left out.
pub(super) fn nvlink_pairs(devices: &[DeviceReport]) -> Vec<GpuLink> {
    let rate_of: BTreeMap<&str, Option<u64>> = devices
        .iter()
        .map(|d| (d.bus_id.as_str(), d.link_rate))
        .collect();
    // Per ordered pair, the number of links.
    let mut pairs: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    // Per GPU with links to switches, how many.
    let mut switched: Vec<(&str, u32)> = Vec::new();
    for d in devices {
        let mut to_switch = 0u32;
        for l in d.links.iter().filter(|l| l.active) {
            match l.remote {
                Remote::Switch => to_switch += 1,
                Remote::Gpu | Remote::NotReported => {
                    let Some(remote) = l.remote_bus_id.as_deref() else {
                        continue;
                    };
                    // A far end that is no GPU NVML lists joins no two GPUs here.
                    let Some((&remote, _)) = rate_of.get_key_value(remote) else {
                        continue;
                    };
                    if remote != d.bus_id {
                        *pairs.entry((d.bus_id.as_str(), remote)).or_default() += 1;
                    }
                }
                Remote::IbmNpu | Remote::Other(_) => {}
            }
        }
        if to_switch > 0 {
            switched.push((d.bus_id.as_str(), to_switch));
        }
    }
    for &(a, na) in &switched {
        for &(b, nb) in &switched {
            if a != b {
                *pairs.entry((a, b)).or_default() += na.min(nb);
            }
        }
    }
    pairs
        .into_iter()
        .map(|((from, to), links)| {
            let rate = match (rate_of[from], rate_of[to]) {
                (Some(a), Some(b)) => a.min(b),
                _ => 0,
            };
            GpuLink {
                from: from.to_owned(),
                to: to.to_owned(),
                kind: GpuLinkKind::NvLink,
                links,
                bandwidth_bytes_per_sec: rate.saturating_mul(u64::from(links)),
                weight: 0,
            }
        })
        .collect()
}

/// A PCI bus id as NVML writes it (`00000000:18:00.0`, upper-case, an 8-digit domain)
/// in discovery's form (`0000:18:00.0`); `None` when it is not `domain:bus:device.function`.
pub(super) fn normalise_bus_id(text: &str) -> Option<String> {
    let mut parts = text.trim().split(':');
    let (Some(domain), Some(bus), Some(devfn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let (device, function) = devfn.split_once('.')?;
    let hex = |s: &str, digits: usize| {
        (!s.is_empty() && s.len() <= digits)
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let (domain, bus, device, function) = (
        hex(domain, 8)?,
        hex(bus, 2)?,
        hex(device, 2)?,
        hex(function, 1)?,
    );
    (device < 32 && function < 8)
        .then(|| format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// Why NVML gave no links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NvmlError {
    /// The library did not load, lacks a function, or `nvmlInit_v2` failed: no NVIDIA
    /// driver here.
    Unavailable(String),
    /// A call after `nvmlInit_v2` failed.
    Failed(String),
}

/// What NVML reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    /// The library that was loaded, as named.
    pub(super) library: String,
    /// Every GPU NVML lists, with its links.
    pub(super) devices: Vec<DeviceReport>,
}

/// Loads NVML (`library`, else [`LIBRARY_NAMES`] in turn), initialises it and reads
/// every GPU's NVLinks.
///
/// # Errors
///
/// [`NvmlError::Unavailable`] when no library loads (every one tried, with the
/// loader's words), one lacks a function, or `nvmlInit_v2` fails;
/// [`NvmlError::Failed`] when a later call fails. Both name the library or function and
/// NVML's error string.
pub(super) fn read(library: Option<&Path>) -> Result<Found, NvmlError> {
    let nvml = Nvml::load(library).map_err(NvmlError::Unavailable)?;
    let session = nvml.init().map_err(NvmlError::Unavailable)?;
    let devices = session.devices().map_err(NvmlError::Failed)?;
    Ok(Found {
        library: nvml.name.clone(),
        devices,
    })
}

/// `nvmlDevice_t`.
type Device = *mut c_void;
type VoidFn = unsafe extern "C" fn() -> c_uint;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> c_uint;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> c_uint;
type PciInfoFn = unsafe extern "C" fn(Device, *mut PciInfo) -> c_uint;
type ComputeCapabilityFn = unsafe extern "C" fn(Device, *mut c_int, *mut c_int) -> c_uint;
type LinkValueFn = unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> c_uint;
type LinkPciInfoFn = unsafe extern "C" fn(Device, c_uint, *mut PciInfo) -> c_uint;
type ErrorStringFn = unsafe extern "C" fn(c_uint) -> *const c_char;

/// `nvmlPciInfo_t` of `nvml.h` (the `_v3` / `_v2` layout).
#[repr(C)]
struct PciInfo {
    /// `busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE]`: `0000:18:00.0`.
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    /// `busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE]`: `00000000:18:00.0`.
    bus_id: [c_char; 32],
}

impl PciInfo {
    fn zeroed() -> PciInfo {
        PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        }
    }

    /// The normalised bus id: `busId`, else `busIdLegacy`.
    fn bus_id(&self) -> Option<String> {
        let text = |chars: &[c_char]| -> String {
            let bytes: Vec<u8> = chars
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c.to_ne_bytes()[0])
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        normalise_bus_id(&text(&self.bus_id))
            .or_else(|| normalise_bus_id(&text(&self.bus_id_legacy)))
    }
}

/// The loaded library and the functions discovery calls. The function pointers are
/// only called through `&self` while `_library` (dropped last) keeps them valid.
struct Nvml {
    init: VoidFn,
    shutdown: VoidFn,
    count: CountFn,
    handle: HandleFn,
    pci_info: PciInfoFn,
    compute_capability: Option<ComputeCapabilityFn>,
    link_state: LinkValueFn,
    link_remote_type: Option<LinkValueFn>,
    link_remote_pci_info: LinkPciInfoFn,
    error_string: ErrorStringFn,
    /// The library as named (a path or a soname).
    name: String,
    _library: Library,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml").field("name", &self.name).finish()
    }
}

impl Nvml {
    /// Opens `library`, else the first of [`LIBRARY_NAMES`] that loads, and looks up
    /// its functions. The error names every library tried, with the loader's words,
    /// or the missing function.
    fn load(library: Option<&Path>) -> Result<Nvml, String> {
        let candidates: Vec<(OsString, String, String)> = match library {
            Some(path) => vec![(
                path.as_os_str().to_owned(),
                path.display().to_string(),
                format!("{}={}", halo_params::NVML_LIBRARY.name, path.display()),
            )],
            None => LIBRARY_NAMES
                .iter()
                .map(|n| (OsString::from(n), (*n).to_owned(), (*n).to_owned()))
                .collect(),
        };
        let mut tried = Vec::new();
        for (file, name, place) in candidates {
            // SAFETY: loading a shared library runs its initialisers. The candidates are
            // NVIDIA's driver library or what the user named in HALO_NVML_LIBRARY; their
            // initialisers are what any program that links NVML (nvidia-smi) runs.
            match unsafe { Library::new(&file) } {
                Ok(lib) => return Nvml::resolve(lib, name),
                Err(e) => tried.push(format!("{place}: {}", loader_message(&e, &name))),
            }
        }
        Err(tried.join("; "))
    }

    /// Looks up the functions of an opened library.
    fn resolve(lib: Library, name: String) -> Result<Nvml, String> {
        /// A function by name; `T` must be its C type.
        fn get<T: Copy>(lib: &Library, name: &str, symbol: &str) -> Result<T, String> {
            let c_name = format!("{symbol}\0");
            // SAFETY: every `T` this is called with is the function-pointer type of
            // `symbol`'s declaration in nvml.h; the pointer is copied out and only
            // called while the library stays loaded (it is kept in `Nvml`).
            unsafe { lib.get::<T>(c_name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| format!("{name}: no function {symbol} ({e})"))
        }
        let optional = |symbol: &str| get::<LinkValueFn>(&lib, &name, symbol).ok();
        Ok(Nvml {
            init: get(&lib, &name, "nvmlInit_v2")?,
            shutdown: get(&lib, &name, "nvmlShutdown")?,
            count: get(&lib, &name, "nvmlDeviceGetCount_v2")?,
            handle: get(&lib, &name, "nvmlDeviceGetHandleByIndex_v2")?,
            pci_info: get(&lib, &name, "nvmlDeviceGetPciInfo_v3")?,
            compute_capability: get(&lib, &name, "nvmlDeviceGetCudaComputeCapability").ok(),
            link_state: get(&lib, &name, "nvmlDeviceGetNvLinkState")?,
            link_remote_type: optional("nvmlDeviceGetNvLinkRemoteDeviceType"),
            link_remote_pci_info: get(&lib, &name, "nvmlDeviceGetNvLinkRemotePciInfo_v2")?,
            error_string: get(&lib, &name, "nvmlErrorString")?,
            name,
            _library: lib,
        })
    }

    /// `function: NVML's words (code)`.
    fn error(&self, function: &str, code: c_uint) -> String {
        // SAFETY: nvmlErrorString takes any nvmlReturn_t and returns a pointer to a
        // static NUL-terminated string (or null, checked); it may be called before
        // nvmlInit.
        let text = unsafe {
            let p = (self.error_string)(code);
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        };
        format!(
            "{function}: {} (NVML error {code})",
            text.unwrap_or_else(|| "no error string".to_owned())
        )
    }

    fn check(&self, function: &str, code: c_uint) -> Result<(), String> {
        if code == SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    /// `nvmlInit_v2`; the session shuts NVML down when dropped.
    fn init(&self) -> Result<Session<'_>, String> {
        // SAFETY: nvmlInit_v2 takes no arguments; NVML counts its initialisations, so
        // each one is matched by the session's nvmlShutdown.
        let code = unsafe { (self.init)() };
        self.check(&format!("{} nvmlInit_v2", self.name), code)?;
        Ok(Session { nvml: self })
    }
}

/// NVML between `nvmlInit_v2` and `nvmlShutdown`.
struct Session<'a> {
    nvml: &'a Nvml,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("nvml", &self.nvml).finish()
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // SAFETY: matches the session's successful nvmlInit_v2; no handle is used after.
        let code = unsafe { (self.nvml.shutdown)() };
        if code != SUCCESS {
            tracing::debug!("{}", self.nvml.error("nvmlShutdown", code));
        }
    }
}

impl Session<'_> {
    /// Every GPU with its links.
    fn devices(&self) -> Result<Vec<DeviceReport>, String> {
        let nvml = self.nvml;
        let mut count: c_uint = 0;
        // SAFETY: NVML is initialised; `count` is a valid place for the result.
        let code = unsafe { (nvml.count)(&mut count) };
        nvml.check("nvmlDeviceGetCount_v2", code)?;
        let mut out = Vec::new();
        for index in 0..count {
            let mut device: Device = std::ptr::null_mut();
            // SAFETY: NVML is initialised, `index` is below the count it gave, and
            // `device` is a valid place for the handle.
            let code = unsafe { (nvml.handle)(index, &mut device) };
            nvml.check(&format!("nvmlDeviceGetHandleByIndex_v2({index})"), code)?;
            let mut pci = PciInfo::zeroed();
            // SAFETY: `device` is a handle NVML gave; `pci` has nvmlPciInfo_t's layout.
            let code = unsafe { (nvml.pci_info)(device, &mut pci) };
            nvml.check(&format!("nvmlDeviceGetPciInfo_v3(GPU {index})"), code)?;
            let bus_id = pci
                .bus_id()
                .ok_or_else(|| format!("nvmlDeviceGetPciInfo_v3(GPU {index}): no bus id"))?;
            out.push(DeviceReport {
                link_rate: self.link_rate(device, &bus_id)?,
                links: self.links(device, &bus_id)?,
                bus_id,
            });
        }
        Ok(out)
    }

    /// The per-link rate of a GPU, from its compute capability.
    fn link_rate(&self, device: Device, bus_id: &str) -> Result<Option<u64>, String> {
        let Some(f) = self.nvml.compute_capability else {
            return Ok(None);
        };
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: `device` is a handle NVML gave; both are valid places for the result.
        let code = unsafe { f(device, &mut major, &mut minor) };
        match code {
            SUCCESS => Ok(link_rate(major, minor)),
            ERROR_NOT_SUPPORTED => Ok(None),
            _ => Err(self.nvml.error(
                &format!("nvmlDeviceGetCudaComputeCapability({bus_id})"),
                code,
            )),
        }
    }

    /// The links of a GPU, up to its last one.
    fn links(&self, device: Device, bus_id: &str) -> Result<Vec<LinkReport>, String> {
        let nvml = self.nvml;
        let mut out = Vec::new();
        for link in 0..MAX_LINKS {
            let mut state: c_uint = 0;
            // SAFETY: `device` is a handle NVML gave; `state` is a valid place for the
            // nvmlEnableState_t (a C enum, 32 bits).
            let code = unsafe { (nvml.link_state)(device, link, &mut state) };
            match code {
                SUCCESS => {}
                ERROR_INVALID_ARGUMENT => break,
                ERROR_NOT_SUPPORTED => continue,
                _ => {
                    return Err(nvml.error(
                        &format!("nvmlDeviceGetNvLinkState({bus_id}, link {link})"),
                        code,
                    ));
                }
            }
            if state != FEATURE_ENABLED {
                out.push(LinkReport {
                    active: false,
                    remote: Remote::NotReported,
                    remote_bus_id: None,
                });
                continue;
            }
            let remote = match nvml.link_remote_type {
                None => Remote::NotReported,
                Some(f) => {
                    let mut value: c_uint = 0;
                    // SAFETY: `device` is a handle NVML gave; `value` is a valid place for
                    // the nvmlIntNvLinkDeviceType_t (a C enum, 32 bits).
                    let code = unsafe { f(device, link, &mut value) };
                    match code {
                        SUCCESS => Remote::from_nvml(value),
                        ERROR_NOT_SUPPORTED => Remote::NotReported,
                        _ => {
                            return Err(nvml.error(
                                &format!(
                                    "nvmlDeviceGetNvLinkRemoteDeviceType({bus_id}, link {link})"
                                ),
                                code,
                            ));
                        }
                    }
                }
            };
            let mut pci = PciInfo::zeroed();
            // SAFETY: `device` is a handle NVML gave; `pci` has nvmlPciInfo_t's layout.
            let code = unsafe { (nvml.link_remote_pci_info)(device, link, &mut pci) };
            let remote_bus_id = match code {
                SUCCESS => pci.bus_id(),
                ERROR_NOT_SUPPORTED => None,
                _ => {
                    return Err(nvml.error(
                        &format!("nvmlDeviceGetNvLinkRemotePciInfo_v2({bus_id}, link {link})"),
                        code,
                    ));
                }
            };
            out.push(LinkReport {
                active: true,
                remote,
                remote_bus_id,
            });
        }
        Ok(out)
    }
}

/// The loader's own words (libloading's `Display` hides the `dlerror` text), without
/// the library's name when the loader starts with it.
fn loader_message(e: &libloading::Error, name: &str) -> String {
    let text = match e {
        libloading::Error::DlOpen { desc } => format!("{desc:?}")
            .trim_start_matches("DlDescription(")
            .trim_end_matches(')')
            .trim_matches('"')
            .to_owned(),
        other => other.to_string(),
    };
    text.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix(": "))
        .map_or_else(|| text.clone(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn bus(i: usize) -> String {
        format!("0000:{:02x}:00.0", 0x18 + 0x10 * i)
    }

    fn link(remote: Remote, to: Option<String>) -> LinkReport {
        LinkReport {
            active: true,
            remote,
            remote_bus_id: to,
        }
    }

    fn device(i: usize, links: Vec<LinkReport>) -> DeviceReport {
        DeviceReport {
            bus_id: bus(i),
            link_rate: link_rate(9, 0),
            links,
        }
    }

    fn nvlink(from: usize, to: usize, links: u32) -> GpuLink {
        GpuLink {
            from: bus(from),
            to: bus(to),
            kind: GpuLinkKind::NvLink,
            links,
            bandwidth_bytes_per_sec: u64::from(links) * 25 * GB,
            weight: 0,
        }
    }

    /// A DGX H100: 8 GPUs, each with 18 active links, all to the NVSwitches (whose bus
    /// ids NVML reports as it likes: here none).
    #[test]
    fn dgx_h100_switches_join_every_pair() {
        let devices: Vec<DeviceReport> = (0..8)
            .map(|i| device(i, vec![link(Remote::Switch, None); 18]))
            .collect();
        let pairs = nvlink_pairs(&devices);
        assert_eq!(pairs.len(), 56);
        for p in &pairs {
            assert_ne!(p.from, p.to);
            assert_eq!(p.kind, GpuLinkKind::NvLink);
            assert_eq!(p.links, 18);
            assert_eq!(p.bandwidth_bytes_per_sec, 450 * GB);
            assert_eq!(p.weight, 0);
        }
        let expected: Vec<GpuLink> = (0..8)
            .flat_map(|a| {
                (0..8)
                    .filter(move |&b| b != a)
                    .map(move |b| nvlink(a, b, 18))
            })
            .collect();
        assert_eq!(pairs, expected);
    }

    /// Through the switches a pair gets what the GPU with fewer switch links has.
    #[test]
    fn switch_pairs_take_the_smaller_link_count() {
        let devices = vec![
            device(0, vec![link(Remote::Switch, None); 18]),
            device(1, vec![link(Remote::Switch, None); 12]),
            device(2, vec![]),
        ];
        assert_eq!(
            nvlink_pairs(&devices),
            vec![nvlink(0, 1, 12), nvlink(1, 0, 12)]
        );
    }

    /// Four GPUs with NVLink bridges: 0-1 and 2-3 with 4 links each, nothing else; a
    /// driver without the remote type reports the far end by bus id only.
    #[test]
    fn direct_links_count_per_pair() {
        let to = |i: usize, remote: Remote| vec![link(remote, Some(bus(i))); 4];
        let devices = vec![
            device(0, to(1, Remote::Gpu)),
            device(1, to(0, Remote::Gpu)),
            device(2, to(3, Remote::NotReported)),
            device(3, to(2, Remote::NotReported)),
        ];
        assert_eq!(
            nvlink_pairs(&devices),
            vec![
                nvlink(0, 1, 4),
                nvlink(1, 0, 4),
                nvlink(2, 3, 4),
                nvlink(3, 2, 4)
            ]
        );
    }

    #[test]
    fn inactive_links_are_ignored() {
        let inactive = |to: Option<String>, remote| LinkReport {
            active: false,
            remote,
            remote_bus_id: to,
        };
        let devices = vec![
            device(
                0,
                vec![
                    link(Remote::Gpu, Some(bus(1))),
                    inactive(Some(bus(1)), Remote::Gpu),
                    inactive(None, Remote::Switch),
                ],
            ),
            device(
                1,
                vec![
                    link(Remote::Gpu, Some(bus(0))),
                    inactive(None, Remote::NotReported),
                ],
            ),
            device(2, vec![inactive(None, Remote::Switch); 18]),
        ];
        assert_eq!(
            nvlink_pairs(&devices),
            vec![nvlink(0, 1, 1), nvlink(1, 0, 1)]
        );
    }

    /// A far end that is no GPU NVML lists (a GPU hidden from this process, another
    /// device) and no switch, an IBM NPU, an unknown type, a missing bus id and a link
    /// back to the GPU itself join no two GPUs here: left out.
    #[test]
    fn links_to_no_known_gpu_are_left_out() {
        let devices = vec![
            device(
                0,
                vec![
                    link(Remote::Gpu, Some("0000:99:00.0".to_owned())),
                    link(Remote::NotReported, Some("0000:99:00.0".to_owned())),
                    link(Remote::IbmNpu, Some(bus(1))),
                    link(Remote::Other(0xff), Some(bus(1))),
                    link(Remote::Gpu, None),
                    link(Remote::Gpu, Some(bus(0))),
                    link(Remote::Gpu, Some(bus(1))),
                ],
            ),
            device(1, vec![]),
        ];
        assert_eq!(nvlink_pairs(&devices), vec![nvlink(0, 1, 1)]);
    }

    #[test]
    fn an_unknown_rate_gives_no_bandwidth() {
        let mut devices = vec![
            device(0, vec![link(Remote::Gpu, Some(bus(1))); 4]),
            device(1, vec![link(Remote::Gpu, Some(bus(0))); 4]),
        ];
        devices[1].link_rate = None;
        let pairs = nvlink_pairs(&devices);
        assert_eq!(pairs.len(), 2);
        assert!(
            pairs
                .iter()
                .all(|p| p.links == 4 && p.bandwidth_bytes_per_sec == 0)
        );
    }

    #[test]
    fn link_rates_by_compute_capability() {
        assert_eq!(link_rate(6, 0), Some(20 * GB));
        assert_eq!(link_rate(7, 0), Some(25 * GB));
        assert_eq!(link_rate(8, 0), Some(25 * GB));
        assert_eq!(link_rate(9, 0), Some(25 * GB));
        assert_eq!(link_rate(10, 0), Some(50 * GB));
        assert_eq!(link_rate(8, 6), None);
        assert_eq!(link_rate(12, 0), None);
    }

    #[test]
    fn bus_ids_are_normalised() {
        assert_eq!(
            normalise_bus_id("00000000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(
            normalise_bus_id("0000:C1:00.1\n").as_deref(),
            Some("0000:c1:00.1")
        );
        assert_eq!(
            normalise_bus_id("00010000:01:00.0").as_deref(),
            Some("10000:01:00.0")
        );
        assert_eq!(normalise_bus_id(""), None);
        assert_eq!(normalise_bus_id("0000:1b:00"), None);
        assert_eq!(normalise_bus_id("0000:1b:20.0"), None);
        assert_eq!(normalise_bus_id("0000:1b:00.0:0"), None);
        assert_eq!(normalise_bus_id("000000000:1b:00.0"), None);
    }

    #[test]
    fn pci_info_has_the_layout_of_nvml_h() {
        assert_eq!(std::mem::size_of::<PciInfo>(), 16 + 5 * 4 + 32);
        assert_eq!(std::mem::offset_of!(PciInfo, domain), 16);
        assert_eq!(std::mem::offset_of!(PciInfo, bus_id), 36);
        let mut pci = PciInfo::zeroed();
        for (d, s) in pci.bus_id.iter_mut().zip(b"00000000:DB:00.0") {
            *d = *s as c_char;
        }
        assert_eq!(pci.bus_id().as_deref(), Some("0000:db:00.0"));
        pci.bus_id = [0; 32];
        for (d, s) in pci.bus_id_legacy.iter_mut().zip(b"0000:DB:00.0") {
            *d = *s as c_char;
        }
        assert_eq!(pci.bus_id().as_deref(), Some("0000:db:00.0"));
    }

    #[test]
    fn a_missing_library_is_unavailable_naming_the_path() {
        let path = Path::new("/nonexistent/halo-test/libnvidia-ml.so.1");
        let err = read(Some(path)).unwrap_err();
        let NvmlError::Unavailable(why) = err else {
            panic!("{err:?}");
        };
        assert!(
            why.starts_with("HALO_NVML_LIBRARY=/nonexistent/halo-test/libnvidia-ml.so.1: "),
            "{why}"
        );
        assert!(why.contains("No such file"), "{why}");
    }

    #[test]
    fn a_file_that_is_no_library_is_unavailable() {
        let path = std::env::temp_dir().join(format!("halo-nvml-{}.so", std::process::id()));
        std::fs::write(&path, "not a library\n").unwrap();
        let err = read(Some(&path));
        let _ = std::fs::remove_file(&path);
        let Err(NvmlError::Unavailable(why)) = err else {
            panic!("{err:?}");
        };
        assert!(
            why.starts_with(&format!("HALO_NVML_LIBRARY={}: ", path.display())),
            "{why}"
        );
    }

    /// A library that loads but is not NVML: the first missing function is named.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_library_without_nvml_names_the_missing_function() {
        let err = read(Some(Path::new("libc.so.6")));
        let Err(NvmlError::Unavailable(why)) = err else {
            panic!("{err:?}");
        };
        assert!(
            why.starts_with("libc.so.6: no function nvmlInit_v2"),
            "{why}"
        );
    }
}
