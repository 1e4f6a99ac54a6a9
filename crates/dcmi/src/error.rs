//! Errors of the DCMI layer: one variant per DCMI return code, plus what the binding itself
//! can detect (a missing symbol, a value out of range). Unknown codes become `Unexpected`.

use super::bindings as sys;
use std::path::PathBuf;

/// An error from one DCMI call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DcmiError {
    #[error("invalid parameter (-8001)")]
    InvalidParameter,
    #[error("operation not permitted (-8002)")]
    OperNotPermitted,
    #[error("memory operation failed (-8003)")]
    MemOperateFail,
    #[error("secure function failed (-8004)")]
    SecureFunFail,
    #[error("internal error (-8005)")]
    InnerErr,
    #[error("timed out (-8006)")]
    TimeOut,
    #[error("invalid device id (-8007)")]
    InvalidDeviceId,
    #[error("device does not exist (-8008)")]
    DeviceNotExist,
    #[error("ioctl failed (-8009)")]
    IoctlFail,
    #[error("send message failed (-8010)")]
    SendMsgFail,
    #[error("receive message failed (-8011)")]
    RecvMsgFail,
    #[error("driver not ready (-8012)")]
    NotReady,
    #[error("not supported in a container (-8013)")]
    NotSupportInContainer,
    #[error("file operation failed (-8014)")]
    FileOperateFail,
    #[error("reset failed (-8015)")]
    ResetFail,
    #[error("operation aborted (-8016)")]
    AbortOperate,
    #[error("device is upgrading (-8017)")]
    IsUpgrading,
    #[error("resource occupied (-8020)")]
    ResourceOccupied,
    #[error("partition not right (-8022)")]
    PartitionNotRight,
    #[error("configuration does not exist (-8023)")]
    ConfigInfoNotExist,
    #[error("device or feature not supported (-8255)")]
    NotSupport,
    #[error("unexpected return code {0}")]
    Unexpected(i32),
    #[error("symbol {symbol} is missing from libdcmi.so")]
    SymbolMissing { symbol: &'static str },
    #[error("{call} returned {value}, outside {limit}")]
    OutOfRange {
        call: &'static str,
        value: u64,
        limit: &'static str,
    },
}

impl DcmiError {
    /// Maps a DCMI return code; `None` for `DCMI_OK`.
    pub fn from_code(rc: i32) -> Option<DcmiError> {
        use DcmiError::*;
        Some(match rc {
            sys::DCMI_OK => return None,
            sys::DCMI_ERR_CODE_INVALID_PARAMETER => InvalidParameter,
            sys::DCMI_ERR_CODE_OPER_NOT_PERMITTED => OperNotPermitted,
            sys::DCMI_ERR_CODE_MEM_OPERATE_FAIL => MemOperateFail,
            sys::DCMI_ERR_CODE_SECURE_FUN_FAIL => SecureFunFail,
            sys::DCMI_ERR_CODE_INNER_ERR => InnerErr,
            sys::DCMI_ERR_CODE_TIME_OUT => TimeOut,
            sys::DCMI_ERR_CODE_INVALID_DEVICE_ID => InvalidDeviceId,
            sys::DCMI_ERR_CODE_DEVICE_NOT_EXIST => DeviceNotExist,
            sys::DCMI_ERR_CODE_IOCTL_FAIL => IoctlFail,
            sys::DCMI_ERR_CODE_SEND_MSG_FAIL => SendMsgFail,
            sys::DCMI_ERR_CODE_RECV_MSG_FAIL => RecvMsgFail,
            sys::DCMI_ERR_CODE_NOT_REDAY => NotReady,
            sys::DCMI_ERR_CODE_NOT_SUPPORT_IN_CONTAINER => NotSupportInContainer,
            sys::DCMI_ERR_CODE_FILE_OPERATE_FAIL => FileOperateFail,
            sys::DCMI_ERR_CODE_RESET_FAIL => ResetFail,
            sys::DCMI_ERR_CODE_ABORT_OPERATE => AbortOperate,
            sys::DCMI_ERR_CODE_IS_UPGRADING => IsUpgrading,
            sys::DCMI_ERR_CODE_RESOURCE_OCCUPIED => ResourceOccupied,
            sys::DCMI_ERR_CODE_PARTITION_NOT_RIGHT => PartitionNotRight,
            sys::DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST => ConfigInfoNotExist,
            sys::DCMI_ERR_CODE_NOT_SUPPORT => NotSupport,
            other => Unexpected(other),
        })
    }

    /// Turns a return code into `Ok(())` or the matching error.
    pub fn check(rc: i32) -> Result<(), DcmiError> {
        match DcmiError::from_code(rc) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// The DCMI return code this error stands for; binding-side errors use MindCluster's
    /// loader pseudo codes (-99998 missing function, -99997 other).
    pub fn code(&self) -> i32 {
        use DcmiError::*;
        match self {
            InvalidParameter => sys::DCMI_ERR_CODE_INVALID_PARAMETER,
            OperNotPermitted => sys::DCMI_ERR_CODE_OPER_NOT_PERMITTED,
            MemOperateFail => sys::DCMI_ERR_CODE_MEM_OPERATE_FAIL,
            SecureFunFail => sys::DCMI_ERR_CODE_SECURE_FUN_FAIL,
            InnerErr => sys::DCMI_ERR_CODE_INNER_ERR,
            TimeOut => sys::DCMI_ERR_CODE_TIME_OUT,
            InvalidDeviceId => sys::DCMI_ERR_CODE_INVALID_DEVICE_ID,
            DeviceNotExist => sys::DCMI_ERR_CODE_DEVICE_NOT_EXIST,
            IoctlFail => sys::DCMI_ERR_CODE_IOCTL_FAIL,
            SendMsgFail => sys::DCMI_ERR_CODE_SEND_MSG_FAIL,
            RecvMsgFail => sys::DCMI_ERR_CODE_RECV_MSG_FAIL,
            NotReady => sys::DCMI_ERR_CODE_NOT_REDAY,
            NotSupportInContainer => sys::DCMI_ERR_CODE_NOT_SUPPORT_IN_CONTAINER,
            FileOperateFail => sys::DCMI_ERR_CODE_FILE_OPERATE_FAIL,
            ResetFail => sys::DCMI_ERR_CODE_RESET_FAIL,
            AbortOperate => sys::DCMI_ERR_CODE_ABORT_OPERATE,
            IsUpgrading => sys::DCMI_ERR_CODE_IS_UPGRADING,
            ResourceOccupied => sys::DCMI_ERR_CODE_RESOURCE_OCCUPIED,
            PartitionNotRight => sys::DCMI_ERR_CODE_PARTITION_NOT_RIGHT,
            ConfigInfoNotExist => sys::DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST,
            NotSupport => sys::DCMI_ERR_CODE_NOT_SUPPORT,
            Unexpected(rc) => *rc,
            SymbolMissing { .. } => -99998,
            OutOfRange { .. } => -99997,
        }
    }
}

/// Why `libdcmi.so` could not be found, loaded or initialised.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("libdcmi.so not found or rejected; tried: {}", tried_list(.tried))]
    NotFound { tried: Vec<(PathBuf, String)> },
    #[error("{}: {reason}", .path.display())]
    Untrusted { path: PathBuf, reason: String },
    #[error("dlopen {}: {detail}", .path.display())]
    Open { path: PathBuf, detail: String },
    #[error("{}: {source}", .path.display())]
    Init { path: PathBuf, source: DcmiError },
    #[error("{} is already open in this process (DCMI is not thread-safe)", .path.display())]
    Busy { path: PathBuf },
    #[error("{}: device enumeration failed: {source}", .path.display())]
    Enumerate { path: PathBuf, source: DcmiError },
    #[error("{}: the driver enumerated no NPU", .path.display())]
    NoNpu { path: PathBuf },
    #[error("{}: dcmi_init and enumeration did not finish within {timeout:?}", .path.display())]
    InitTimeout {
        path: PathBuf,
        timeout: std::time::Duration,
    },
    #[error("cannot start the DCMI thread: {0}")]
    Thread(String),
}

fn tried_list(tried: &[(PathBuf, String)]) -> String {
    if tried.is_empty() {
        return "nothing (no candidate path exists)".to_owned();
    }
    tried
        .iter()
        .map(|(p, why)| format!("{}: {why}", p.display()))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_code_round_trips() {
        let codes = [
            -8001, -8002, -8003, -8004, -8005, -8006, -8007, -8008, -8009, -8010, -8011, -8012,
            -8013, -8014, -8015, -8016, -8017, -8020, -8022, -8023, -8255,
        ];
        for rc in codes {
            let e = DcmiError::from_code(rc).unwrap();
            assert!(!matches!(e, DcmiError::Unexpected(_)), "{rc} not mapped");
            assert_eq!(e.code(), rc);
            assert!(e.to_string().contains(&rc.to_string()), "{e}");
        }
    }

    #[test]
    fn ok_is_not_an_error_and_unknown_codes_are_unexpected() {
        assert_eq!(DcmiError::from_code(0), None);
        assert_eq!(DcmiError::check(0), Ok(()));
        assert_eq!(
            DcmiError::from_code(-8018),
            Some(DcmiError::Unexpected(-8018))
        );
        assert_eq!(DcmiError::from_code(1), Some(DcmiError::Unexpected(1)));
        assert_eq!(DcmiError::Unexpected(42).code(), 42);
    }
}
