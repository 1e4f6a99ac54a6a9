//! Safe binding of `libdcmi.so`, opened at run time.
//!
//! This module holds every `unsafe` line of the agent. Each wrapped call has one shape: fetch
//! the symbol (missing → [`DcmiError::SymbolMissing`], never a panic), zero the out-value,
//! call, map the return code through [`DcmiError::check`], and only then read the value.
//!
//! DCMI is not thread-safe and `dcmi_init` must run once per process. So the library, once
//! loaded and initialised, stays loaded for the life of the process, and at most one [`Dcmi`]
//! handle to it exists at a time; the handle is `Send` but not `Sync`, so the thread that
//! owns it is the only one that can call into the driver.
#![allow(unsafe_code)]

#[rustfmt::skip]
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    clippy::all,
    clippy::pedantic,
    unsafe_op_in_unsafe_fn
)]
mod bindings;
pub mod discovery;
pub mod error;

pub use error::{DcmiError, LoadError};

use bindings as sys;
use std::cell::Cell;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// API generation of the loaded driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `dcmi_*(card_id, device_id, …)`: 310P, 910, 910B, 910_93.
    V1,
    /// `dcmiv2_*(dev_id, …)`: 950.
    V2,
}

/// One NPU chip as enumerated by the driver (MCUs and CPUs are skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpuChip {
    /// Logic id: what `ASCEND_RT_VISIBLE_DEVICES` and the agent's `--devices` use.
    pub logic_id: u32,
    /// NPU id ("card") of the v1 API; equals the logic id on a 950.
    pub card: i32,
    /// Chip index on the card; 0 on a 950.
    pub chip: i32,
    /// Chip name from chip info, e.g. `910B3`.
    pub name: String,
}

/// HBM figures of one chip, in MB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hbm {
    pub used_mb: u64,
    pub total_mb: u64,
}

/// Which call produced an AI Cube reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CubeCall {
    /// `dcmi_get_device_multi_utilization_rate` (or its pre-release name), field `aic_util`.
    Multi,
    /// `dcmi_get_device_utilization_rate` with input type 14.
    Single,
}

struct Loaded {
    lib: sys::DcmiLib,
    api: Api,
    path: PathBuf,
    in_use: AtomicBool,
}

/// Libraries loaded and initialised by this process; never unloaded, so `dcmi_init` runs once.
static LOADED: Mutex<Vec<Arc<Loaded>>> = Mutex::new(Vec::new());

/// Exclusive handle to an initialised `libdcmi.so`.
pub struct Dcmi {
    loaded: Arc<Loaded>,
    /// DCMI is not thread-safe: the handle may move between threads but not be shared.
    _not_sync: PhantomData<Cell<()>>,
}

impl Drop for Dcmi {
    fn drop(&mut self) {
        self.loaded.in_use.store(false, Ordering::Release);
    }
}

macro_rules! sym {
    ($self:ident, $name:ident) => {
        match &$self.loaded.lib.$name {
            Ok(f) => *f,
            Err(_) => {
                return Err(DcmiError::SymbolMissing {
                    symbol: stringify!($name),
                })
            }
        }
    };
}

impl Dcmi {
    /// Opens `path` with `RTLD_LAZY | RTLD_GLOBAL`, runs `dcmi_init` (or `dcmiv2_init` when
    /// the driver answers -8255, as a 950 does) once per process, and returns the only handle.
    pub fn open(path: &Path) -> Result<Dcmi, LoadError> {
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match loaded.iter().find(|l| l.path == canonical) {
            Some(l) => l.clone(),
            None => {
                let l = Arc::new(load_and_init(&canonical)?);
                loaded.push(l.clone());
                l
            }
        };
        if entry.in_use.swap(true, Ordering::AcqRel) {
            return Err(LoadError::Busy { path: canonical });
        }
        Ok(Dcmi {
            loaded: entry,
            _not_sync: PhantomData,
        })
    }

    /// API generation the driver accepted at init.
    pub fn api(&self) -> Api {
        self.loaded.api
    }

    /// Path the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.loaded.path
    }

    /// Enumerates NPU chips: cards → chips per card → logic id and name, skipping MCUs.
    #[doc(alias = "dcmi_get_card_list")]
    #[doc(alias = "dcmiv2_get_device_list")]
    pub fn chips(&self) -> Result<Vec<NpuChip>, DcmiError> {
        match self.api() {
            Api::V1 => self.chips_v1(),
            Api::V2 => self.chips_v2(),
        }
    }

    fn card_list(&self) -> Result<Vec<i32>, DcmiError> {
        const MAX: usize = sys::DCMI_MAX_CARD_NUM as usize;
        let f = match (
            &self.loaded.lib.dcmi_get_card_list,
            &self.loaded.lib.dcmi_get_card_num_list,
        ) {
            (Ok(f), _) | (Err(_), Ok(f)) => *f,
            (Err(_), Err(_)) => {
                return Err(DcmiError::SymbolMissing {
                    symbol: "dcmi_get_card_list",
                });
            }
        };
        let mut num: i32 = 0;
        let mut list = [0i32; MAX];
        // SAFETY: both out-pointers are valid for the call; `list` holds `MAX` ints as told.
        DcmiError::check(unsafe { f(&mut num, list.as_mut_ptr(), MAX as i32) })?;
        if num < 0 || num as usize > MAX {
            return Err(DcmiError::OutOfRange {
                call: "dcmi_get_card_list",
                value: num as i64 as u64,
                limit: "0..=64 cards",
            });
        }
        Ok(list[..num as usize].to_vec())
    }

    fn chips_v1(&self) -> Result<Vec<NpuChip>, DcmiError> {
        let mut chips = Vec::new();
        for card in self.card_list()? {
            let num_in_card = sym!(self, dcmi_get_device_num_in_card);
            let mut n: i32 = 0;
            // SAFETY: `n` is a valid out-pointer.
            DcmiError::check(unsafe { num_in_card(card, &mut n) })?;
            if !(0..=16).contains(&n) {
                return Err(DcmiError::OutOfRange {
                    call: "dcmi_get_device_num_in_card",
                    value: n as i64 as u64,
                    limit: "0..=16 chips",
                });
            }
            let mcu = self.mcu_id(card);
            for chip in 0..n {
                if Some(chip) == mcu || !self.is_npu(card, chip) {
                    continue;
                }
                let logic = sym!(self, dcmi_get_device_logic_id);
                let mut id: i32 = -1;
                // SAFETY: `id` is a valid out-pointer.
                DcmiError::check(unsafe { logic(&mut id, card, chip) })?;
                let logic_id = u32::try_from(id).map_err(|_| DcmiError::OutOfRange {
                    call: "dcmi_get_device_logic_id",
                    value: id as i64 as u64,
                    limit: "non-negative",
                })?;
                chips.push(NpuChip {
                    logic_id,
                    card,
                    chip,
                    name: self.chip_name_v1(card, chip),
                });
            }
        }
        Ok(chips)
    }

    fn mcu_id(&self, card: i32) -> Option<i32> {
        let f = self.loaded.lib.dcmi_get_device_id_in_card.as_ref().ok()?;
        let (mut max, mut mcu, mut cpu) = (0i32, -1i32, -1i32);
        // SAFETY: three valid out-pointers.
        let rc = unsafe { f(card, &mut max, &mut mcu, &mut cpu) };
        (rc == sys::DCMI_OK && mcu >= 0).then_some(mcu)
    }

    fn is_npu(&self, card: i32, chip: i32) -> bool {
        let Ok(f) = &self.loaded.lib.dcmi_get_device_type else {
            return true;
        };
        let mut kind: sys::dcmi_unit_type = sys::dcmi_unit_type_INVALID_TYPE;
        // SAFETY: `kind` is a valid out-pointer of the enum's C size.
        let rc = unsafe { f(card, chip, &mut kind) };
        rc != sys::DCMI_OK || kind == sys::dcmi_unit_type_NPU_TYPE
    }

    fn chip_name_v1(&self, card: i32, chip: i32) -> String {
        let Ok(f) = &self.loaded.lib.dcmi_get_device_chip_info else {
            return String::new();
        };
        // SAFETY: the struct is plain old data; all-zero is a valid value.
        let mut info: sys::dcmi_chip_info = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-struct of the declared layout.
        let rc = unsafe { f(card, chip, &mut info) };
        if rc == sys::DCMI_OK {
            c_name(&info.chip_name)
        } else {
            String::new()
        }
    }

    fn chips_v2(&self) -> Result<Vec<NpuChip>, DcmiError> {
        const MAX: usize = 2 * sys::DCMI_MAX_CARD_NUM as usize;
        let list_fn = sym!(self, dcmiv2_get_device_list);
        let mut ids = [0i32; MAX];
        let mut count: i32 = 0;
        // SAFETY: `ids` holds `MAX` ints as told; `count` is a valid out-pointer.
        DcmiError::check(unsafe { list_fn(ids.as_mut_ptr(), &mut count, MAX as i32) })?;
        if count < 0 || count as usize > MAX {
            return Err(DcmiError::OutOfRange {
                call: "dcmiv2_get_device_list",
                value: count as i64 as u64,
                limit: "0..=128 devices",
            });
        }
        let mut chips = Vec::new();
        for &id in &ids[..count as usize] {
            let Ok(logic_id) = u32::try_from(id) else {
                continue;
            };
            let mut name = String::new();
            if let Ok(f) = &self.loaded.lib.dcmiv2_get_device_chip_info {
                // SAFETY: plain old data; all-zero is valid.
                let mut info: sys::dcmi_chip_info_v2 = unsafe { std::mem::zeroed() };
                // SAFETY: `info` is a valid out-struct of the declared layout.
                if unsafe { f(id, &mut info) } == sys::DCMI_OK {
                    name = c_name(&info.chip_name);
                }
            }
            chips.push(NpuChip {
                logic_id,
                card: id,
                chip: 0,
                name,
            });
        }
        Ok(chips)
    }

    /// AI Cube usage through the multi-utilization call (`aic_util`), percent.
    #[doc(alias = "dcmi_get_device_multi_utilization_rate")]
    #[doc(alias = "dcmiv2_get_device_multi_utilization_rate")]
    pub fn aicube_multi(&self, chip: &NpuChip) -> Result<u8, DcmiError> {
        // SAFETY: plain old data; all-zero is valid.
        let mut info: sys::dcmi_multi_utilization_info = unsafe { std::mem::zeroed() };
        let rc = match self.api() {
            Api::V1 => {
                let l = &self.loaded.lib;
                let f = match (
                    &l.dcmi_get_device_multi_utilization_rate,
                    &l.dcmi_get_device_utilization_rate_v2,
                ) {
                    (Ok(f), _) | (Err(_), Ok(f)) => *f,
                    (Err(_), Err(_)) => {
                        return Err(DcmiError::SymbolMissing {
                            symbol: "dcmi_get_device_multi_utilization_rate",
                        });
                    }
                };
                // SAFETY: `info` is a valid out-struct of the declared layout.
                unsafe { f(chip.card, chip.chip, &mut info) }
            }
            Api::V2 => {
                let f = sym!(self, dcmiv2_get_device_multi_utilization_rate);
                // SAFETY: `info` is a valid out-struct of the declared layout.
                unsafe { f(chip.card, &mut info) }
            }
        };
        DcmiError::check(rc)?;
        percent("dcmi_get_device_multi_utilization_rate", info.aic_util)
    }

    /// AI Cube usage through the single utilization call with input type 14, percent.
    #[doc(alias = "dcmi_get_device_utilization_rate")]
    #[doc(alias = "dcmiv2_get_device_utilization_rate")]
    pub fn aicube_single(&self, chip: &NpuChip) -> Result<u8, DcmiError> {
        let mut rate: u32 = 0;
        let rc = match self.api() {
            Api::V1 => {
                let f = sym!(self, dcmi_get_device_utilization_rate);
                // SAFETY: `rate` is a valid out-pointer.
                unsafe {
                    f(
                        chip.card,
                        chip.chip,
                        sys::DCMI_UTILIZATION_RATE_AICUBE,
                        &mut rate,
                    )
                }
            }
            Api::V2 => {
                let f = sym!(self, dcmiv2_get_device_utilization_rate);
                // SAFETY: `rate` is a valid out-pointer.
                unsafe { f(chip.card, sys::DCMI_UTILIZATION_RATE_AICUBE, &mut rate) }
            }
        };
        DcmiError::check(rc)?;
        percent("dcmi_get_device_utilization_rate", rate)
    }

    /// AI Cube usage through `call`.
    pub fn aicube(&self, chip: &NpuChip, call: CubeCall) -> Result<u8, DcmiError> {
        match call {
            CubeCall::Multi => self.aicube_multi(chip),
            CubeCall::Single => self.aicube_single(chip),
        }
    }

    /// HBM used and total, in MB.
    #[doc(alias = "dcmi_get_device_hbm_info")]
    #[doc(alias = "dcmiv2_get_device_hbm_info")]
    pub fn hbm(&self, chip: &NpuChip) -> Result<Hbm, DcmiError> {
        // SAFETY: plain old data; all-zero is valid.
        let mut info: sys::dcmi_hbm_info = unsafe { std::mem::zeroed() };
        let rc = match self.api() {
            Api::V1 => {
                let f = sym!(self, dcmi_get_device_hbm_info);
                // SAFETY: `info` is a valid out-struct of the declared layout.
                unsafe { f(chip.card, chip.chip, &mut info) }
            }
            Api::V2 => {
                let f = sym!(self, dcmiv2_get_device_hbm_info);
                // SAFETY: `info` is a valid out-struct of the declared layout.
                unsafe { f(chip.card, &mut info) }
            }
        };
        DcmiError::check(rc)?;
        if info.memory_usage > info.memory_size {
            return Err(DcmiError::OutOfRange {
                call: "dcmi_get_device_hbm_info",
                value: info.memory_usage,
                limit: "memory_usage <= memory_size",
            });
        }
        Ok(Hbm {
            used_mb: info.memory_usage,
            total_mb: info.memory_size,
        })
    }

    /// Device health code: 0 normal, 1 minor, 2 major, 3 critical alarm.
    #[doc(alias = "dcmi_get_device_health")]
    #[doc(alias = "dcmiv2_get_device_health")]
    pub fn health(&self, chip: &NpuChip) -> Result<u32, DcmiError> {
        let mut health: u32 = 0;
        let rc = match self.api() {
            Api::V1 => {
                let f = sym!(self, dcmi_get_device_health);
                // SAFETY: `health` is a valid out-pointer.
                unsafe { f(chip.card, chip.chip, &mut health) }
            }
            Api::V2 => {
                let f = sym!(self, dcmiv2_get_device_health);
                // SAFETY: `health` is a valid out-pointer.
                unsafe { f(chip.card, &mut health) }
            }
        };
        DcmiError::check(rc)?;
        if health > 3 {
            return Err(DcmiError::OutOfRange {
                call: "dcmi_get_device_health",
                value: health.into(),
                limit: "0..=3",
            });
        }
        Ok(health)
    }
}

fn percent(call: &'static str, value: u32) -> Result<u8, DcmiError> {
    if value > 100 {
        return Err(DcmiError::OutOfRange {
            call,
            value: value.into(),
            limit: "0..=100 %",
        });
    }
    Ok(value as u8)
}

fn c_name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_owned()
}

fn load_and_init(path: &Path) -> Result<Loaded, LoadError> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_LAZY};
    // SAFETY: loading a shared library runs its initialisers. The path passed the ownership
    // check (or the operator explicitly disabled it); that is the trust decision.
    let lib = unsafe { Library::open(Some(path), RTLD_LAZY | RTLD_GLOBAL) }.map_err(|e| {
        LoadError::Open {
            path: path.to_owned(),
            detail: error_chain(&e),
        }
    })?;
    // SAFETY: the field types come from bindgen over our header, which matches the published
    // signatures; missing symbols are stored as errors, not resolved.
    let lib = unsafe { sys::DcmiLib::from_library(lib) }.map_err(|e| LoadError::Open {
        path: path.to_owned(),
        detail: error_chain(&e),
    })?;
    let init_err = |source| LoadError::Init {
        path: path.to_owned(),
        source,
    };
    let init = lib.dcmi_init.as_ref().map_err(|_| {
        init_err(DcmiError::SymbolMissing {
            symbol: "dcmi_init",
        })
    })?;
    // SAFETY: `dcmi_init` takes no arguments; it runs once per loaded library (LOADED).
    let api = match DcmiError::check(unsafe { init() }) {
        Ok(()) => Api::V1,
        Err(DcmiError::NotSupport) => {
            let init2 = lib.dcmiv2_init.as_ref().map_err(|_| {
                init_err(DcmiError::SymbolMissing {
                    symbol: "dcmiv2_init",
                })
            })?;
            // SAFETY: as above, for the v2 API of the 950.
            DcmiError::check(unsafe { init2() }).map_err(init_err)?;
            Api::V2
        }
        Err(e) => return Err(init_err(e)),
    };
    Ok(Loaded {
        lib,
        api,
        path: path.to_owned(),
        in_use: AtomicBool::new(false),
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_above_100_are_rejected() {
        assert_eq!(percent("x", 100), Ok(100));
        assert!(matches!(
            percent("x", 101),
            Err(DcmiError::OutOfRange { value: 101, .. })
        ));
    }

    #[test]
    fn chip_names_stop_at_nul_and_survive_missing_nul() {
        let mut b = [0u8; 32];
        b[..5].copy_from_slice(b"910B3");
        assert_eq!(c_name(&b), "910B3");
        assert_eq!(c_name(&[b'A'; 32]), "A".repeat(32));
    }

    #[test]
    fn generated_layouts_match_the_reference() {
        assert_eq!(std::mem::size_of::<sys::dcmi_hbm_info>(), 32);
        assert_eq!(std::mem::size_of::<sys::dcmi_multi_utilization_info>(), 48);
        assert_eq!(std::mem::size_of::<sys::dcmi_chip_info>(), 100);
        assert_eq!(std::mem::size_of::<sys::dcmi_chip_info_v2>(), 132);
    }
}
