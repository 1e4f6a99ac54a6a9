//! The fault-code calls: the device's error codes from the scenario (`dcmi_get_device_errorcode_v2`,
//! `dcmi_get_device_error_code_list_v2`) and their texts (`dcmi_get_device_errorcode_string`,
//! `dcmi_get_device_error_info_v2`).

use super::{
    DCMI_OK, Driver, ERR_INVALID_DEVICE_ID, ERR_INVALID_PARAMETER, ERR_NOT_SUPPORT, ERROR_CODE_MAX,
    MIN_ERR_INFO_LEN, v1, v2,
};
use crate::scenario::Device;

/// The texts the fake knows (the meaning MindCluster's fault diagnosis gives each code;
/// docs/fault-codes.md); the driver answers -8255 for a code it has no text for.
pub(super) const FAULT_TEXTS: &[(u32, &str, &str)] = &[
    (0x80E0_1801, "HBM ECC", "HBM multi-bit ECC error on access"),
    (
        0x80E1_8402,
        "HBM isolation",
        "HBM multi-bit ECC isolated rows reached 64",
    ),
    (0x80E1_8005, "HBMC parity", "HBM controller parity error"),
    (0x80C9_8001, "AIC reset", "AI Core reset failure"),
    (0x80C9_8002, "AI Core input", "AI Core external input error"),
    (0x80C9_8008, "AI Core ECC", "AI Core multi-bit ECC error"),
    (
        0x8107_8603,
        "port down",
        "network port link changed from up to down",
    ),
    (
        0x8107_8605,
        "port lanes",
        "some lanes of a RoCE port are faulty",
    ),
    (
        0x40F8_4E00,
        "card drop",
        "heartbeat between host and device lost",
    ),
];

pub(super) fn error_codes(d: &Driver, dev: &Device, count: &mut i32, list: &mut [u32]) -> i32 {
    match dev.error_codes_error {
        Some(code) => code,
        None => write_codes(&d.scenario.error_codes_of(dev), count, list),
    }
}

/// The whole text the fake gives `code`, if any (what `npu-smi info -t health` prints).
pub fn fault_text(code: u32) -> Option<&'static str> {
    FAULT_TEXTS
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, _, long)| *long)
}

/// As the driver (`dcmi_fault_manage_intf.c`): its own list of at most 128 is filled first;
/// an empty `list` or more codes than it holds is -8001 with nothing written; otherwise
/// exactly the codes are written and `count` set, so no codes leaves `list` as it was.
pub(super) fn write_codes(codes: &[u32], count: &mut i32, list: &mut [u32]) -> i32 {
    let codes = &codes[..codes.len().min(ERROR_CODE_MAX)];
    if list.is_empty() || codes.len() > list.len() {
        return ERR_INVALID_PARAMETER;
    }
    list[..codes.len()].copy_from_slice(codes);
    *count = codes.len() as i32;
    DCMI_OK
}

/// `dcmi_get_device_errorcode_v2`; a 950 answers -8255 (it has the v2 call only).
pub fn errorcode_v2(card: i32, chip: i32, count: &mut i32, list: &mut [u32]) -> i32 {
    match v1().and_then(|d| {
        d.scenario
            .device(card, chip)
            .map(|dev| (d, dev))
            .ok_or(ERR_INVALID_DEVICE_ID)
    }) {
        Ok((d, dev)) => error_codes(d, dev, count, list),
        Err(e) => e,
    }
}

/// `dcmiv2_get_device_error_code_list`.
pub fn error_code_list_v2(id: i32, count: &mut i32, list: &mut [u32]) -> i32 {
    match v2().and_then(|d| {
        d.scenario
            .device_by_logic(id)
            .map(|dev| (d, dev))
            .ok_or(ERR_INVALID_DEVICE_ID)
    }) {
        Ok((d, dev)) => error_codes(d, dev, count, list),
        Err(e) => e,
    }
}

/// The text of `code` into `buf` (NUL-terminated, cut to fit): the short text below 256
/// bytes, the whole one from 256; below 48 bytes -8001; a code without text -8255.
pub(super) fn error_text(code: u32, buf: &mut [u8]) -> i32 {
    if buf.len() < MIN_ERR_INFO_LEN as usize {
        return ERR_INVALID_PARAMETER;
    }
    let Some((_, short, long)) = FAULT_TEXTS.iter().find(|(c, _, _)| *c == code) else {
        return ERR_NOT_SUPPORT;
    };
    let text = if buf.len() >= 256 { long } else { short };
    let n = text.len().min(buf.len() - 1);
    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
    buf[n] = 0;
    DCMI_OK
}

/// `dcmi_get_device_errorcode_string`.
pub fn errorcode_string(card: i32, chip: i32, code: u32, buf: &mut [u8]) -> i32 {
    match v1().and_then(|d| d.scenario.device(card, chip).ok_or(ERR_INVALID_DEVICE_ID)) {
        Ok(_) => error_text(code, buf),
        Err(e) => e,
    }
}

/// `dcmiv2_get_device_error_info`.
pub fn error_info_v2(id: i32, code: u32, buf: &mut [u8]) -> i32 {
    match v2().and_then(|d| d.scenario.device_by_logic(id).ok_or(ERR_INVALID_DEVICE_ID)) {
        Ok(_) => error_text(code, buf),
        Err(e) => e,
    }
}
