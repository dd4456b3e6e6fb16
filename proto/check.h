/*
 * proto/check.h: internal to proto/. The semantic checks every message
 * passes both before it is encoded and after it is decoded, and the JSON
 * spellings of the enums.
 */
#ifndef MUSTER_PROTO_CHECK_H
#define MUSTER_PROTO_CHECK_H

#include "proto/proto.h"

/* Indexed by the enum value; NULL where the value is not defined. */
extern const char *const proto_device_kind_json[PROTO_DEV_GPU + 1];
extern const char *const proto_rank_state_json[PROTO_RANK_STATE_MAX + 1];
extern const char *const proto_command_json[PROTO_CMD_MAX + 1];
extern const char *const proto_restore_json[PROTO_RESTORE_MAX + 1];
extern const char *const proto_log_error_json[PROTO_LOG_ERROR_MAX + 1];

/*
 * 0 when msg is a message the protocol allows (bounds, enums, strings that
 * fit their buffers, the cross-field rules of PROTOCOL.md), PROTO_E_TYPE for
 * an unknown type, PROTO_E_RANGE otherwise.
 */
int proto_check(const struct proto_msg *msg);

#endif
