/*
 * Minimal declarations of the Ascend DCMI interface (libdcmi.so) used by npu-health-agent.
 *
 * Written for this project from the published signatures, constants and struct layouts
 * (see ../shared/reference/driver-reference.md section 1.8; the fault-code and fault-event
 * calls from hicann/driver src/custom/include/dcmi_interface_api.h and its implementation in
 * dcmi_fault_manage_intf.c at ef377e9, docs/fault-codes.md); it is not the vendor header.
 * Only what the agent calls is declared. bindgen turns it into crates/dcmi/src/bindings.rs
 * in dynamic-loading mode, so every function below is an optional symbol at run time.
 */
#ifndef NPU_HEALTH_AGENT_DCMI_INTERFACE_API_H
#define NPU_HEALTH_AGENT_DCMI_INTERFACE_API_H

/* ---- return codes ---- */
#define DCMI_OK 0
#define DCMI_ERROR_CODE_BASE (-8000)
#define DCMI_ERR_CODE_INVALID_PARAMETER (DCMI_ERROR_CODE_BASE - 1)
#define DCMI_ERR_CODE_OPER_NOT_PERMITTED (DCMI_ERROR_CODE_BASE - 2)
#define DCMI_ERR_CODE_MEM_OPERATE_FAIL (DCMI_ERROR_CODE_BASE - 3)
#define DCMI_ERR_CODE_SECURE_FUN_FAIL (DCMI_ERROR_CODE_BASE - 4)
#define DCMI_ERR_CODE_INNER_ERR (DCMI_ERROR_CODE_BASE - 5)
#define DCMI_ERR_CODE_TIME_OUT (DCMI_ERROR_CODE_BASE - 6)
#define DCMI_ERR_CODE_INVALID_DEVICE_ID (DCMI_ERROR_CODE_BASE - 7)
#define DCMI_ERR_CODE_DEVICE_NOT_EXIST (DCMI_ERROR_CODE_BASE - 8)
#define DCMI_ERR_CODE_IOCTL_FAIL (DCMI_ERROR_CODE_BASE - 9)
#define DCMI_ERR_CODE_SEND_MSG_FAIL (DCMI_ERROR_CODE_BASE - 10)
#define DCMI_ERR_CODE_RECV_MSG_FAIL (DCMI_ERROR_CODE_BASE - 11)
#define DCMI_ERR_CODE_NOT_REDAY (DCMI_ERROR_CODE_BASE - 12)
#define DCMI_ERR_CODE_NOT_SUPPORT_IN_CONTAINER (DCMI_ERROR_CODE_BASE - 13)
#define DCMI_ERR_CODE_FILE_OPERATE_FAIL (DCMI_ERROR_CODE_BASE - 14)
#define DCMI_ERR_CODE_RESET_FAIL (DCMI_ERROR_CODE_BASE - 15)
#define DCMI_ERR_CODE_ABORT_OPERATE (DCMI_ERROR_CODE_BASE - 16)
#define DCMI_ERR_CODE_IS_UPGRADING (DCMI_ERROR_CODE_BASE - 17)
#define DCMI_ERR_CODE_RESOURCE_OCCUPIED (DCMI_ERROR_CODE_BASE - 20)
#define DCMI_ERR_CODE_PARTITION_NOT_RIGHT (DCMI_ERROR_CODE_BASE - 22)
#define DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST (DCMI_ERROR_CODE_BASE - 23)
#define DCMI_ERR_CODE_NOT_SUPPORT (DCMI_ERROR_CODE_BASE - 255)

/* ---- input_type of dcmi_get_device_utilization_rate ---- */
#define DCMI_UTILIZATION_RATE_DDR 1
#define DCMI_UTILIZATION_RATE_AICORE 2
#define DCMI_UTILIZATION_RATE_AICPU 3
#define DCMI_UTILIZATION_RATE_CTRLCPU 4
#define DCMI_UTILIZATION_RATE_DDR_BANDWIDTH 5
#define DCMI_UTILIZATION_RATE_HBM 6
#define DCMI_UTILIZATION_RATE_HBM_BANDWIDTH 10
#define DCMI_UTILIZATION_RATE_VECTORCORE 12
#define DCMI_UTILIZATION_RATE_NPU 13
#define DCMI_UTILIZATION_RATE_AICUBE 14

/* ---- limits ---- */
#define DCMI_MAX_CARD_NUM 64
#define DCMI_MAX_CHIP_NAME_LEN 32
#define DCMI_UTIL_RESERVED_LEN 8
/* Longest list dcmi_get_device_errorcode_v2 fills (the driver's own array; "0 to 128"). */
#define DCMI_ERROR_CODE_MAX_COUNT 128
/* Buffer of dcmi_get_device_errorcode_string: at least 48 bytes (short text), 256 for the
 * whole text; the driver writes at most 256. */
#define DCMI_MIN_ERR_INFO_LEN 48
#define DCMI_MAX_ERR_INFO_LEN 256
/* Fault events (dcmi_subscribe_fault_event). */
#define DCMI_EVENT_FILTER_FLAG_EVENT_ID (1ULL << 0)
#define DCMI_EVENT_FILTER_FLAG_SERVERITY (1ULL << 1)
#define DCMI_EVENT_FILTER_FLAG_NODE_TYPE (1ULL << 2)
#define DCMI_MAX_EVENT_NAME_LENGTH 256
#define DCMI_MAX_EVENT_DATA_LENGTH 32
#define DCMI_MAX_EVENT_RESV_LENGTH 32
/* Health word of a device that does not exist; dcmi_get_device_health answers it with rc 0. */
#define DCMI_HEALTH_DEVICE_NOT_EXIST 0xFFFFFFFF

/* ---- types ---- */
enum dcmi_unit_type {
    NPU_TYPE = 0,
    MCU_TYPE = 1,
    CPU_TYPE = 2,
    INVALID_TYPE = 0xFF
};

/* Byte arrays are NUL padded and not guaranteed to be NUL terminated. */
struct dcmi_chip_info {
    unsigned char chip_type[DCMI_MAX_CHIP_NAME_LEN];
    unsigned char chip_name[DCMI_MAX_CHIP_NAME_LEN];
    unsigned char chip_ver[DCMI_MAX_CHIP_NAME_LEN];
    unsigned int aicore_cnt;
};

struct dcmi_chip_info_v2 {
    unsigned char chip_type[DCMI_MAX_CHIP_NAME_LEN];
    unsigned char chip_name[DCMI_MAX_CHIP_NAME_LEN];
    unsigned char chip_ver[DCMI_MAX_CHIP_NAME_LEN];
    unsigned int aicore_cnt;
    unsigned char npu_name[DCMI_MAX_CHIP_NAME_LEN];
};

/* Sizes in MB, frequency in MHz, temperature in degrees C, bandwidth in percent. */
struct dcmi_hbm_info {
    unsigned long long memory_size;
    unsigned int freq;
    unsigned long long memory_usage;
    int temp;
    unsigned int bandwith_util_rate;
};

/* aic_util is the AI Cube usage in percent. */
struct dcmi_multi_utilization_info {
    unsigned int aic_util;
    unsigned int aiv_util;
    unsigned int aicore_util;
    unsigned int npu_util;
    unsigned int reserved[DCMI_UTIL_RESERVED_LEN];
};

/* Which events a subscription delivers: the fields named by filter_flag must match. */
struct dcmi_event_filter {
    unsigned long long filter_flag;
    unsigned int event_id;
    unsigned char severity;
    unsigned char node_type;
    unsigned char resv[DCMI_MAX_EVENT_RESV_LENGTH];
};

/* One fault event. severity 0 warning .. 3 critical; assertion 0 recovery, 1 occurrence,
 * 2 one-off. alarm_raised_time: milliseconds per the 910B API guide, seconds per
 * MindCluster's header; MindCluster stamps its own time instead. */
struct dcmi_dms_fault_event {
    unsigned int event_id;
    unsigned short deviceid;
    unsigned char node_type;
    unsigned char node_id;
    unsigned char sub_node_type;
    unsigned char sub_node_id;
    unsigned char severity;
    unsigned char assertion;
    int event_serial_num;
    int notify_serial_num;
    unsigned long long alarm_raised_time;
    char event_name[DCMI_MAX_EVENT_NAME_LENGTH];
    char additional_info[DCMI_MAX_EVENT_DATA_LENGTH];
    unsigned char os_id;
    unsigned char resv_1[1];
    unsigned short node_type_ex;
    unsigned short sub_node_type_ex;
    unsigned char resv_2[2];
    unsigned char resv[24];
};

enum dcmi_event_type {
    DCMI_DMS_FAULT_EVENT = 0,
    DCMI_EVENT_TYPE_MAX
};

struct dcmi_event {
    enum dcmi_event_type type;
    union {
        struct dcmi_dms_fault_event dms_event;
    } event_t;
};

typedef void (*dcmi_fault_event_callback)(struct dcmi_event *event);

/* ---- v1 API (310P, 910, 910B, 910_93): (card_id, device_id) addressing ---- */
int dcmi_init(void);
int dcmi_get_card_list(int *card_num, int *card_list, int list_len);
int dcmi_get_card_num_list(int *card_num, int *card_list, int list_len);
int dcmi_get_device_num_in_card(int card_id, int *device_num);
int dcmi_get_device_id_in_card(int card_id, int *device_id_max, int *mcu_id, int *cpu_id);
int dcmi_get_device_type(int card_id, int device_id, enum dcmi_unit_type *device_type);
int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id);
/* The chip's physical id (what the Ascend device plugin names its devices by, "Ascend910-<phy>").
 * MindCluster's copy of the header: component/ascend-common/devmanager/dcmi/dcmi_interface_api.h. */
int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid);
int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info);
int dcmi_get_device_utilization_rate(int card_id, int device_id, int input_type,
                                     unsigned int *utilization_rate);
int dcmi_get_device_multi_utilization_rate(int card_id, int device_id,
                                           struct dcmi_multi_utilization_info *util_info);
/* Pre-release name of dcmi_get_device_multi_utilization_rate, in no released header. Its first
 * declaration (MindCluster 83a5b2ea, 2026-02-11) took a 4-byte struct of four unsigned char;
 * the agent passes the 48-byte struct and checks the figures (src/sampler/plausibility.rs). */
int dcmi_get_device_utilization_rate_v2(int card_id, int device_id,
                                        struct dcmi_multi_utilization_info *util_info);
int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info);
int dcmi_get_device_health(int card_id, int device_id, unsigned int *health);
/* The chip's current fault codes. -8001 (and nothing written) when more than list_len; on
 * success exactly error_count entries are written, so a count of 0 leaves the list as it was.
 * A failure of the type-specific read, "not supported" included, answers -8005; a 950 -8255. */
int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count,
                                 unsigned int *error_code_list, unsigned int list_len);
/* The text of one fault code; buf_size below 48 is -8001. */
int dcmi_get_device_errorcode_string(int card_id, int device_id, unsigned int error_code,
                                     unsigned char *error_info, int buf_size);
/* Fault events as they are raised (card_id = device_id = -1: every device). Once per process;
 * only events raised after the call; at most 64 subscribing processes per node. */
int dcmi_subscribe_fault_event(int card_id, int device_id, struct dcmi_event_filter filter,
                               dcmi_fault_event_callback handler);

/* ---- v2 API (950): logical device id addressing ---- */
int dcmiv2_init(void);
int dcmiv2_get_device_list(int *device_list, int *device_cnt, int list_len);
int dcmiv2_get_device_chip_info(int dev_id, struct dcmi_chip_info_v2 *chip_info);
/* The same on a 950 (MindCluster: devmanager/dcmi/dcmi_interface_api_v2.h). */
int dcmiv2_get_chip_phy_id_by_dev_id(unsigned int dev_id, unsigned int *phyid);
int dcmiv2_get_device_utilization_rate(int dev_id, int input_type, unsigned int *utilization_rate);
int dcmiv2_get_device_multi_utilization_rate(int dev_id,
                                             struct dcmi_multi_utilization_info *util_info);
int dcmiv2_get_device_hbm_info(int dev_id, struct dcmi_hbm_info *hbm_info);
int dcmiv2_get_device_health(int dev_id, unsigned int *health);
int dcmiv2_get_device_error_code_list(int dev_id, int *error_count, unsigned int *error_code_list,
                                      unsigned int list_len);
int dcmiv2_get_device_error_info(int dev_id, unsigned int error_code, unsigned char *error_info,
                                 int buf_size);
int dcmiv2_subscribe_fault_event(int dev_id, struct dcmi_event_filter filter,
                                 dcmi_fault_event_callback handler);

#endif
