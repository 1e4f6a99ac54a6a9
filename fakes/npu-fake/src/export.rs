//! The C ABI of a fake `libdcmi.so`: [`export_dcmi!`](crate::export_dcmi) writes the
//! `extern "C"` functions each cdylib crate exports, every one a thin shell that checks its
//! pointers and calls the safe behaviour in [`crate::dcmi`].

/// Generates the `extern "C"` DCMI exports of a fake library build.
///
/// `export_dcmi!(current)` exports every symbol; `export_dcmi!(legacy)` leaves out the
/// multi-utilization calls and answers utilization type 14 with -8255;
/// `export_dcmi!(prerelease)` exports the multi call only under its pre-release name
/// `dcmi_get_device_utilization_rate_v2`.
#[macro_export]
macro_rules! export_dcmi {
    (current) => {
        $crate::export_dcmi!(@base $crate::dcmi::Build::Current);

        /// # Safety
        /// `out` must be null or point to a writable `dcmi_multi_utilization_info`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_multi_utilization_rate(
            card: i32, chip: i32, out: *mut $crate::dcmi::MultiUtil,
        ) -> i32 {
            // SAFETY: the caller passes a valid out-struct or null (rejected).
            match unsafe { out.as_mut() } {
                Some(out) => $crate::dcmi::multi_util(card, chip, out),
                None => $crate::dcmi::ERR_INVALID_PARAMETER,
            }
        }

        $crate::export_dcmi!(@prerelease_name);

        /// # Safety
        /// `out` must be null or point to a writable `dcmi_multi_utilization_info`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_multi_utilization_rate(
            id: i32, out: *mut $crate::dcmi::MultiUtil,
        ) -> i32 {
            // SAFETY: the caller passes a valid out-struct or null (rejected).
            match unsafe { out.as_mut() } {
                Some(out) => $crate::dcmi::multi_util_v2(id, out),
                None => $crate::dcmi::ERR_INVALID_PARAMETER,
            }
        }
    };
    (legacy) => {
        $crate::export_dcmi!(@base $crate::dcmi::Build::Legacy);
    };
    (prerelease) => {
        $crate::export_dcmi!(@base $crate::dcmi::Build::Current);
        $crate::export_dcmi!(@prerelease_name);
    };
    (@prerelease_name) => {
        /// # Safety
        /// `out` must be null or point to writable memory of the layout the scenario's
        /// `prerelease_layout` names (48 bytes, or 4 for the early form).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_utilization_rate_v2(
            card: i32, chip: i32, out: *mut $crate::dcmi::MultiUtil,
        ) -> i32 {
            if out.is_null() {
                return $crate::dcmi::ERR_INVALID_PARAMETER;
            }
            let (rc, written) = $crate::dcmi::multi_util_prerelease(card, chip);
            match written {
                // SAFETY: non-null, and the caller guarantees the 48-byte struct.
                $crate::dcmi::PrereleaseOut::Full(m) => unsafe { out.write(m) },
                // SAFETY: non-null; the early form writes its 4 bytes only, at the start.
                $crate::dcmi::PrereleaseOut::Early(b) => unsafe {
                    std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), b.len())
                },
            }
            rc
        }
    };
    (@base $build:expr) => {
        /// Pointer-to-reference helper: null pointers become `ERR_INVALID_PARAMETER`.
        macro_rules! out {
            ($p:expr) => {
                // SAFETY: the caller passes valid out-pointers or null (rejected).
                match unsafe { $p.as_mut() } {
                    Some(r) => r,
                    None => return $crate::dcmi::ERR_INVALID_PARAMETER,
                }
            };
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn dcmi_init() -> i32 {
            $crate::dcmi::init()
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn dcmiv2_init() -> i32 {
            $crate::dcmi::init_v2()
        }

        /// # Safety
        /// `num` writable, `list` writable for `len` ints.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_card_list(num: *mut i32, list: *mut i32, len: i32) -> i32 {
            let num = out!(num);
            if list.is_null() || len < 0 {
                return $crate::dcmi::ERR_INVALID_PARAMETER;
            }
            // SAFETY: the caller guarantees `len` writable ints at `list`.
            let list = unsafe { std::slice::from_raw_parts_mut(list, len as usize) };
            $crate::dcmi::card_list(num, list)
        }

        /// # Safety
        /// As `dcmi_get_card_list`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_card_num_list(num: *mut i32, list: *mut i32, len: i32) -> i32 {
            // SAFETY: same contract.
            unsafe { dcmi_get_card_list(num, list, len) }
        }

        /// # Safety
        /// `num` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_num_in_card(card: i32, num: *mut i32) -> i32 {
            $crate::dcmi::device_num_in_card(card, out!(num))
        }

        /// # Safety
        /// All out-pointers writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_id_in_card(
            card: i32, max: *mut i32, mcu: *mut i32, cpu: *mut i32,
        ) -> i32 {
            $crate::dcmi::device_id_in_card(card, out!(max), out!(mcu), out!(cpu))
        }

        /// # Safety
        /// `kind` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_type(card: i32, chip: i32, kind: *mut i32) -> i32 {
            $crate::dcmi::device_type(card, chip, out!(kind))
        }

        /// # Safety
        /// `id` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_logic_id(id: *mut i32, card: i32, chip: i32) -> i32 {
            $crate::dcmi::logic_id(out!(id), card, chip)
        }

        /// # Safety
        /// `phy` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_phyid_from_logicid(logic: u32, phy: *mut u32) -> i32 {
            $crate::dcmi::phy_id(logic, out!(phy))
        }

        /// # Safety
        /// `phy` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_chip_phy_id_by_dev_id(id: u32, phy: *mut u32) -> i32 {
            $crate::dcmi::phy_id_v2(id, out!(phy))
        }

        /// # Safety
        /// `info` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_chip_info(
            card: i32, chip: i32, info: *mut $crate::dcmi::ChipInfo,
        ) -> i32 {
            $crate::dcmi::chip_info(card, chip, out!(info))
        }

        /// # Safety
        /// `rate` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_utilization_rate(
            card: i32, chip: i32, kind: i32, rate: *mut u32,
        ) -> i32 {
            $crate::dcmi::util(card, chip, kind, $build, out!(rate))
        }

        /// # Safety
        /// `info` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_hbm_info(
            card: i32, chip: i32, info: *mut $crate::dcmi::HbmInfo,
        ) -> i32 {
            $crate::dcmi::hbm_info(card, chip, out!(info))
        }

        /// # Safety
        /// `health` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_health(card: i32, chip: i32, health: *mut u32) -> i32 {
            $crate::dcmi::health(card, chip, out!(health))
        }

        /// # Safety
        /// `count` writable, `list` writable for `len` entries.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_errorcode_v2(
            card: i32, chip: i32, count: *mut i32, list: *mut u32, len: u32,
        ) -> i32 {
            let count = out!(count);
            if list.is_null() {
                return $crate::dcmi::ERR_INVALID_PARAMETER;
            }
            // SAFETY: the caller guarantees `len` writable entries at `list`.
            let list = unsafe { std::slice::from_raw_parts_mut(list, len as usize) };
            $crate::dcmi::errorcode_v2(card, chip, count, list)
        }

        /// # Safety
        /// `buf` writable for `len` bytes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmi_get_device_errorcode_string(
            card: i32, chip: i32, code: u32, buf: *mut u8, len: i32,
        ) -> i32 {
            if buf.is_null() || len < 0 {
                return $crate::dcmi::ERR_INVALID_PARAMETER;
            }
            // SAFETY: the caller guarantees `len` writable bytes at `buf`.
            let buf = unsafe { std::slice::from_raw_parts_mut(buf, len as usize) };
            $crate::dcmi::errorcode_string(card, chip, code, buf)
        }

        /// # Safety
        /// `list` writable for `len` ints, `count` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_list(list: *mut i32, count: *mut i32, len: i32) -> i32 {
            let count = out!(count);
            if list.is_null() || len < 0 {
                return $crate::dcmi::ERR_INVALID_PARAMETER;
            }
            // SAFETY: the caller guarantees `len` writable ints at `list`.
            let list = unsafe { std::slice::from_raw_parts_mut(list, len as usize) };
            $crate::dcmi::device_list_v2(list, count)
        }

        /// # Safety
        /// `info` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_chip_info(
            id: i32, info: *mut $crate::dcmi::ChipInfoV2,
        ) -> i32 {
            $crate::dcmi::chip_info_v2(id, out!(info))
        }

        /// # Safety
        /// `rate` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_utilization_rate(id: i32, kind: i32, rate: *mut u32) -> i32 {
            $crate::dcmi::util_v2(id, kind, $build, out!(rate))
        }

        /// # Safety
        /// `info` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_hbm_info(id: i32, info: *mut $crate::dcmi::HbmInfo) -> i32 {
            $crate::dcmi::hbm_info_v2(id, out!(info))
        }

        /// # Safety
        /// `health` writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_health(id: i32, health: *mut u32) -> i32 {
            $crate::dcmi::health_v2(id, out!(health))
        }

        /// # Safety
        /// `count` writable, `list` writable for `len` entries.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_error_code_list(
            id: i32, count: *mut i32, list: *mut u32, len: u32,
        ) -> i32 {
            let count = out!(count);
            if list.is_null() {
                return $crate::dcmi::ERR_INVALID_PARAMETER;
            }
            // SAFETY: the caller guarantees `len` writable entries at `list`.
            let list = unsafe { std::slice::from_raw_parts_mut(list, len as usize) };
            $crate::dcmi::error_code_list_v2(id, count, list)
        }

        /// # Safety
        /// `buf` writable for `len` bytes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn dcmiv2_get_device_error_info(
            id: i32, code: u32, buf: *mut u8, len: i32,
        ) -> i32 {
            if buf.is_null() || len < 0 {
                return $crate::dcmi::ERR_INVALID_PARAMETER;
            }
            // SAFETY: the caller guarantees `len` writable bytes at `buf`.
            let buf = unsafe { std::slice::from_raw_parts_mut(buf, len as usize) };
            $crate::dcmi::error_info_v2(id, code, buf)
        }
    };
}
