//! The types and constants of the C API: data types, algorithms, reduction
//! operations, the unique id, the configuration, version numbers.

use crate::error::{Failure, FfiResult};
use halo_rs::{Algorithm, InitConfig, ReduceOp};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::time::Duration;

/// Major version of this library.
pub const HALO_MAJOR: c_int = 0;
/// Minor version of this library.
pub const HALO_MINOR: c_int = 1;
/// Patch version of this library.
pub const HALO_PATCH: c_int = 0;
/// `HALO_MAJOR * 10000 + HALO_MINOR * 100 + HALO_PATCH`, as `haloGetVersion` reports it
/// (NCCL's encoding since 2.9). Compare it with `haloGetVersion` to detect a library
/// older than the header.
pub const HALO_VERSION_CODE: c_int = 100;

/// Bytes in a `haloUniqueId` (as `NCCL_UNIQUE_ID_BYTES`).
pub const HALO_UNIQUE_ID_BYTES: usize = 128;

/// `haloConfig_t.magic` as `HALO_CONFIG_INITIALIZER` sets it ("HALO" in ASCII).
pub const HALO_CONFIG_MAGIC: c_uint = 0x48414c4f;

/// A `haloConfig_t` integer field left unset: the environment's value (or HALO's
/// default) is used.
pub const HALO_CONFIG_UNDEF_INT: c_int = -2147483647 - 1;

/// The largest user tag of `haloSendTagged` / `haloRecvTagged` and their non-blocking
/// forms: 2^24 - 1 (tags are `0 .. HALO_MAX_TAG`).
pub const HALO_MAX_TAG: c_int = 16_777_215;
const _: () = assert!(HALO_MAX_TAG as u32 == halo_rs::MAX_USER_TAG);

/// `haloCommSplit`'s color for a rank that joins no new communicator.
pub const HALO_SPLIT_NOCOLOR: c_int = -1;

/// The element types of collectives, in NCCL's order and with NCCL's numbers
/// (`ncclInt8` = 0 ... `ncclBfloat16` = 9). Passed as a `haloDataType_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum haloDataType {
    /// `int8_t` (also `haloChar`).
    haloInt8 = 0,
    /// `uint8_t`.
    haloUint8 = 1,
    /// `int32_t` (also `haloInt`).
    haloInt32 = 2,
    /// `uint32_t`.
    haloUint32 = 3,
    /// `int64_t`.
    haloInt64 = 4,
    /// `uint64_t`.
    haloUint64 = 5,
    /// IEEE 754 half precision, 2 bytes (also `haloHalf`).
    haloFloat16 = 6,
    /// `float` (also `haloFloat`).
    haloFloat32 = 7,
    /// `double` (also `haloDouble`).
    haloFloat64 = 8,
    /// bfloat16, 2 bytes.
    haloBfloat16 = 9,
}

/// A `haloDataType` value (an `int32_t`: a value outside the enum is rejected with
/// `haloInvalidArgument`, never undefined behaviour).
pub type haloDataType_t = i32;

impl haloDataType {
    const ALL: [haloDataType; 10] = [
        haloDataType::haloInt8,
        haloDataType::haloUint8,
        haloDataType::haloInt32,
        haloDataType::haloUint32,
        haloDataType::haloInt64,
        haloDataType::haloUint64,
        haloDataType::haloFloat16,
        haloDataType::haloFloat32,
        haloDataType::haloFloat64,
        haloDataType::haloBfloat16,
    ];

    /// The data type a C value names.
    pub(crate) fn from_raw(raw: haloDataType_t) -> FfiResult<haloDataType> {
        usize::try_from(raw)
            .ok()
            .and_then(|i| haloDataType::ALL.get(i).copied())
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "datatype {raw} is not a haloDataType_t (haloInt8 = 0 .. haloBfloat16 = 9)"
                ))
            })
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            haloDataType::haloInt8 | haloDataType::haloUint8 => 1,
            haloDataType::haloFloat16 | haloDataType::haloBfloat16 => 2,
            haloDataType::haloInt32 | haloDataType::haloUint32 | haloDataType::haloFloat32 => 4,
            haloDataType::haloInt64 | haloDataType::haloUint64 | haloDataType::haloFloat64 => 8,
        }
    }

    /// A floating-point type (the four that can be added as floats).
    pub(crate) fn is_float(self) -> bool {
        matches!(
            self,
            haloDataType::haloFloat16
                | haloDataType::haloBfloat16
                | haloDataType::haloFloat32
                | haloDataType::haloFloat64
        )
    }
}

/// Runs `$body` with `$E` the Rust element type of the `haloDataType` `$dt` (every
/// one is `Reducible`).
macro_rules! with_elem {
    ($dt:expr, $E:ident => $body:expr) => {
        match $dt {
            $crate::types::haloDataType::haloInt8 => {
                type $E = i8;
                $body
            }
            $crate::types::haloDataType::haloUint8 => {
                type $E = u8;
                $body
            }
            $crate::types::haloDataType::haloInt32 => {
                type $E = i32;
                $body
            }
            $crate::types::haloDataType::haloUint32 => {
                type $E = u32;
                $body
            }
            $crate::types::haloDataType::haloInt64 => {
                type $E = i64;
                $body
            }
            $crate::types::haloDataType::haloUint64 => {
                type $E = u64;
                $body
            }
            $crate::types::haloDataType::haloFloat16 => {
                type $E = halo_rs::f16;
                $body
            }
            $crate::types::haloDataType::haloFloat32 => {
                type $E = f32;
                $body
            }
            $crate::types::haloDataType::haloFloat64 => {
                type $E = f64;
                $body
            }
            $crate::types::haloDataType::haloBfloat16 => {
                type $E = halo_rs::bf16;
                $body
            }
        }
    };
}
pub(crate) use with_elem;

/// The all-to-all algorithms (`haloConfig_t.algorithm`, like `HALO_ALGO`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum haloAlgorithm {
    /// Chosen per call by HALO's cost model over the topology (the default).
    haloAlgoAuto = 0,
    /// The vendor fan-out (what RCCL and NCCL do): every send and receive at once.
    haloAlgoFlat = 1,
    /// N-1 rounds of pairwise exchanges.
    haloAlgoPairwise = 2,
    /// ceil(log2 N) rounds; for small messages.
    haloAlgoBruck = 3,
    /// HALO: hierarchical over the topology, one aggregated message per remote domain.
    haloAlgoHalo = 4,
    /// Sender-side aggregation by local index (RCCL/MSCCL "2D").
    haloAlgoHalo2d = 5,
}

/// A `haloAlgorithm` value (an `int32_t`, checked like `haloDataType_t`).
pub type haloAlgorithm_t = i32;

impl haloAlgorithm {
    /// The algorithm a C value names (`None`: automatic).
    pub(crate) fn from_raw(raw: haloAlgorithm_t) -> FfiResult<Option<Algorithm>> {
        Ok(match raw {
            0 => None,
            1 => Some(Algorithm::Flat),
            2 => Some(Algorithm::Pairwise),
            3 => Some(Algorithm::Bruck),
            4 => Some(Algorithm::Halo),
            5 => Some(Algorithm::Halo2d),
            _ => {
                return Err(Failure::invalid(format!(
                    "algorithm {raw} is not a haloAlgorithm_t (haloAlgoAuto = 0 .. haloAlgoHalo2d = 5)"
                )));
            }
        })
    }
}

/// Reduction operations of the reducing collectives (`haloAllReduce`,
/// `haloReduceScatter`), with NCCL's numbers (`ncclSum` = 0, `ncclProd` = 1, `ncclMax`
/// = 2, `ncclMin` = 3, `ncclAvg` = 4).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum haloRedOp {
    /// Sum (integers wrap around; `haloFloat16` / `haloBfloat16` are added in `float`
    /// and rounded to nearest-even).
    haloSum = 0,
    /// Product (integers wrap around; `haloFloat16` / `haloBfloat16` are multiplied in
    /// `float` and rounded to nearest-even).
    haloProd = 1,
    /// Maximum (a NaN operand gives NaN).
    haloMax = 2,
    /// Minimum (a NaN operand gives NaN).
    haloMin = 3,
    /// Average, as `ncclAvg`: the sum divided by the number of ranks; floats divide in
    /// their own type (`haloFloat16` / `haloBfloat16` through `float`), integers with
    /// truncating division (towards zero) of the wrapped sum.
    haloAvg = 4,
}

/// A `haloRedOp` value (an `int32_t`, checked like `haloDataType_t`).
pub type haloRedOp_t = i32;

impl haloRedOp {
    /// The operation a C value names.
    pub(crate) fn from_raw(raw: haloRedOp_t) -> FfiResult<ReduceOp> {
        match raw {
            0 => Ok(ReduceOp::Sum),
            1 => Ok(ReduceOp::Prod),
            2 => Ok(ReduceOp::Max),
            3 => Ok(ReduceOp::Min),
            4 => Ok(ReduceOp::Avg),
            _ => Err(Failure::invalid(format!(
                "op {raw} is not a haloRedOp_t (haloSum = 0, haloProd = 1, haloMax = 2, \
                 haloMin = 3, haloAvg = 4)"
            ))),
        }
    }
}

/// A device stream (`cudaStream_t`, `hipStream_t`). `haloAllToAll` and `haloAllToAllv`
/// take device buffers with a stream (the device path); every other call, and host
/// buffers, take NULL.
pub type haloStream_t = *mut c_void;

/// Checks that no stream was given to a call that has no device path.
pub(crate) fn check_stream(stream: haloStream_t) -> FfiResult<()> {
    if stream.is_null() {
        Ok(())
    } else {
        Err(Failure::invalid(
            "stream must be NULL: only haloAllToAll and haloAllToAllv take device buffers \
             with a stream; this call works on host memory",
        ))
    }
}

/// The id that lets ranks find each other (as `ncclUniqueId`): made by
/// `haloGetUniqueId` on one rank and passed to the others out of band (MPI_Bcast, a
/// file, a key-value store). Opaque bytes: the rendezvous root's address and a random
/// job secret. Treat it as a secret.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct haloUniqueId {
    /// The bytes.
    pub internal: [c_char; HALO_UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for haloUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("haloUniqueId").finish_non_exhaustive()
    }
}

const _: () = assert!(HALO_UNIQUE_ID_BYTES == halo_rs::bootstrap::UNIQUE_ID_BYTES);

impl haloUniqueId {
    pub(crate) fn from_id(id: &halo_rs::UniqueId) -> haloUniqueId {
        haloUniqueId {
            internal: id.as_bytes().map(|b| b as c_char),
        }
    }

    pub(crate) fn to_id(self) -> FfiResult<halo_rs::UniqueId> {
        let bytes = self.internal.map(|c| c as u8);
        Ok(halo_rs::UniqueId::from_bytes(&bytes)?)
    }
}

/// How `haloCommInitRankConfig` and `haloCommSplit` set up a communicator.
///
/// Always start from `HALO_CONFIG_INITIALIZER` (which sets `size`, `magic` and
/// `version` and leaves every other field unset), then change the fields you need:
///
/// ```c
/// haloConfig_t config = HALO_CONFIG_INITIALIZER;
/// config.algorithm = haloAlgoHalo;
/// config.timeoutMs = 30000;
/// ```
///
/// An unset field (`HALO_CONFIG_UNDEF_INT`, NULL) takes the environment's value
/// (`HALO_ALGO`, `HALO_TIMEOUT_MS`, `HALO_BOOTSTRAP_TIMEOUT_MS`, `HALO_FABRIC_PROVIDER`,
/// `HALO_TOPOLOGY`), else HALO's default. Every rank must pass the same values. The
/// strings are read during the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct haloConfig_t {
    /// `sizeof(haloConfig_t)`.
    pub size: usize,
    /// `HALO_CONFIG_MAGIC`.
    pub magic: c_uint,
    /// `HALO_VERSION_CODE` of the header the program was compiled with (informational).
    pub version: c_uint,
    /// A `haloAlgorithm_t` forced for every all-to-all (default: `haloAlgoAuto`).
    pub algorithm: haloAlgorithm_t,
    /// Milliseconds one collective may take before it fails with `haloTimeout`
    /// (> 0; default 60000).
    pub timeoutMs: c_int,
    /// Milliseconds the ranks wait for each other while the communicator is created
    /// (> 0; default 120000).
    pub bootstrapTimeoutMs: c_int,
    /// The libfabric provider for every peer, e.g. `"shm"` or `"tcp;ofi_rxm"`
    /// (default: `shm` on the same host, `tcp;ofi_rxm` between hosts).
    pub provider: *const c_char,
    /// A topology preset (`"frontier:2"`, `"nodes:2x4"`) or the path of a topology file
    /// describing the job (default: one node per host name, found at set-up).
    pub topology: *const c_char,
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `s` is a valid NUL-terminated string.
unsafe fn utf8(s: *const c_char, what: &str) -> FfiResult<String> {
    // SAFETY: per the contract.
    let s = unsafe { CStr::from_ptr(s) };
    s.to_str()
        .map(str::to_string)
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// A positive number of milliseconds from a config field (`None`: unset).
fn millis(v: c_int, what: &str) -> FfiResult<Option<Duration>> {
    if v == HALO_CONFIG_UNDEF_INT {
        return Ok(None);
    }
    match u64::try_from(v) {
        Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
        _ => Err(Failure::invalid(format!(
            "config->{what} is {v}: expected a positive number of milliseconds \
             (or HALO_CONFIG_UNDEF_INT for the default)"
        ))),
    }
}

/// The fields a `haloConfig_t` sets (`None`: unset).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ConfigFields {
    /// `Some(None)`: `haloAlgoAuto` explicitly.
    pub(crate) algorithm: Option<Option<Algorithm>>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) bootstrap_timeout: Option<Duration>,
    pub(crate) provider: Option<String>,
    pub(crate) topology: Option<String>,
}

impl ConfigFields {
    /// Reads and checks the fields `config` sets (NULL: none).
    ///
    /// Checks `magic` and `size` before reading any other field, so an uninitialised
    /// struct is refused without following its pointers.
    ///
    /// # Safety
    /// `config` is NULL or points to `sizeof(haloConfig_t)` readable bytes, whose string
    /// fields, once `magic` and `size` are right, are NULL or NUL-terminated strings.
    pub(crate) unsafe fn read(config: *const haloConfig_t) -> FfiResult<ConfigFields> {
        let mut out = ConfigFields::default();
        if config.is_null() {
            return Ok(out);
        }
        // SAFETY: non-null and readable per the contract; every field is valid for any
        // bit pattern (integers and raw pointers), and the pointers are not followed yet.
        let c = unsafe { config.read() };
        if c.magic != HALO_CONFIG_MAGIC {
            return Err(Failure::invalid(format!(
                "config is not initialised (magic is {:#010x}, expected HALO_CONFIG_MAGIC \
                 {HALO_CONFIG_MAGIC:#010x}): start from haloConfig_t config = \
                 HALO_CONFIG_INITIALIZER;",
                c.magic
            )));
        }
        let ours = std::mem::size_of::<haloConfig_t>();
        if c.size != ours {
            return Err(Failure::invalid(format!(
                "config->size is {} but this libhalo's haloConfig_t has {ours} bytes: set it \
                 with HALO_CONFIG_INITIALIZER, and compile against the halo.h of the library \
                 you link",
                c.size
            )));
        }
        if c.algorithm != HALO_CONFIG_UNDEF_INT {
            out.algorithm = Some(
                haloAlgorithm::from_raw(c.algorithm)
                    .map_err(|f| Failure::invalid(format!("config->{}", f.message)))?,
            );
        }
        out.timeout = millis(c.timeoutMs, "timeoutMs")?;
        out.bootstrap_timeout = millis(c.bootstrapTimeoutMs, "bootstrapTimeoutMs")?;
        if !c.provider.is_null() {
            // SAFETY: the config is initialised (magic and size checked), so per the
            // contract `provider` is a NUL-terminated string.
            let p = unsafe { utf8(c.provider, "config->provider") }?;
            if p.trim().is_empty() {
                return Err(Failure::invalid(
                    "config->provider is empty: name a libfabric provider (\"shm\", \
                     \"tcp;ofi_rxm\") or leave it NULL",
                ));
            }
            out.provider = Some(p.trim().to_string());
        }
        if !c.topology.is_null() {
            // SAFETY: as for `provider`.
            out.topology = Some(unsafe { utf8(c.topology, "config->topology") }?);
        }
        Ok(out)
    }

    /// The configuration of a new job: the environment's (`InitConfig::from_env`), with
    /// these fields over it.
    pub(crate) fn over_env(self) -> FfiResult<InitConfig> {
        let mut c = InitConfig::from_env()?;
        if let Some(a) = self.algorithm {
            c.algorithm = a;
        }
        if let Some(t) = self.timeout {
            c.timeout = t;
        }
        if let Some(t) = self.bootstrap_timeout {
            c.bootstrap_timeout = t;
        }
        if let Some(p) = &self.provider {
            c.fabric.force(p);
        }
        if let Some(t) = self.topology {
            c.topology = t;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn initializer() -> haloConfig_t {
        haloConfig_t {
            size: std::mem::size_of::<haloConfig_t>(),
            magic: HALO_CONFIG_MAGIC,
            version: HALO_VERSION_CODE as c_uint,
            algorithm: HALO_CONFIG_UNDEF_INT,
            timeoutMs: HALO_CONFIG_UNDEF_INT,
            bootstrapTimeoutMs: HALO_CONFIG_UNDEF_INT,
            provider: std::ptr::null(),
            topology: std::ptr::null(),
        }
    }

    #[test]
    fn version_matches_the_crate() {
        assert_eq!(HALO_MAJOR.to_string(), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(HALO_MINOR.to_string(), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(HALO_PATCH.to_string(), env!("CARGO_PKG_VERSION_PATCH"));
        assert_eq!(
            HALO_VERSION_CODE,
            HALO_MAJOR * 10000 + HALO_MINOR * 100 + HALO_PATCH
        );
        assert_eq!(HALO_CONFIG_UNDEF_INT, i32::MIN);
    }

    #[test]
    fn data_types() {
        assert_eq!(haloDataType::from_raw(7).unwrap().size(), 4);
        assert_eq!(
            haloDataType::from_raw(9).unwrap(),
            haloDataType::haloBfloat16
        );
        for (i, t) in haloDataType::ALL.iter().enumerate() {
            assert_eq!(*t as i32, i as i32);
        }
        for bad in [-1, 10, i32::MAX, i32::MIN] {
            let e = haloDataType::from_raw(bad).unwrap_err();
            assert!(
                e.message.contains(&format!("datatype {bad} ")),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn config_fields_override() {
        let mut c = initializer();
        c.algorithm = haloAlgorithm::haloAlgoBruck as i32;
        c.timeoutMs = 1500;
        c.provider = c"tcp;ofi_rxm".as_ptr();
        c.topology = c"nodes:2x2".as_ptr();
        // SAFETY: a valid config with static strings.
        let ic = unsafe { ConfigFields::read(&c) }
            .unwrap()
            .over_env()
            .unwrap();
        assert_eq!(ic.algorithm, Some(Algorithm::Bruck));
        assert_eq!(ic.timeout, Duration::from_millis(1500));
        assert_eq!(ic.fabric.net_provider, "tcp;ofi_rxm");
        assert_eq!(ic.fabric.local_provider, None);
        assert_eq!(ic.topology, "nodes:2x2");
    }

    #[test]
    fn bad_configs_are_refused() {
        let check = |c: haloConfig_t, needle: &str| {
            // SAFETY: `c` is a readable haloConfig_t whose pointers are NULL or static.
            let e = unsafe { ConfigFields::read(&c) }.unwrap_err();
            assert_eq!(e.code, crate::error::haloResult::haloInvalidArgument);
            assert!(
                e.message.contains(needle),
                "{needle:?} not in {}",
                e.message
            );
        };
        // Garbage, as an uninitialised struct on the stack: pointers that must not be
        // followed.
        let garbage = haloConfig_t {
            size: 0xdead_beef,
            magic: 0x1234_5678,
            version: 7,
            algorithm: 99,
            timeoutMs: -5,
            bootstrapTimeoutMs: 0,
            provider: 0x10 as *const c_char,
            topology: 0x20 as *const c_char,
        };
        check(garbage, "not initialised");
        check(
            haloConfig_t {
                size: 8,
                ..initializer()
            },
            "config->size is 8",
        );
        check(
            haloConfig_t {
                algorithm: 6,
                ..initializer()
            },
            "config->algorithm 6",
        );
        check(
            haloConfig_t {
                timeoutMs: 0,
                ..initializer()
            },
            "timeoutMs is 0",
        );
        check(
            haloConfig_t {
                bootstrapTimeoutMs: -1,
                ..initializer()
            },
            "bootstrapTimeoutMs is -1",
        );
        check(
            haloConfig_t {
                provider: c"  ".as_ptr(),
                ..initializer()
            },
            "provider is empty",
        );
    }
}
