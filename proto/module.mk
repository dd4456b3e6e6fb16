# Wire protocol: framing, codec, authentication. Pure code, no I/O.
PROTO_SRCS := proto/codec.c proto/fastbeat.c proto/check.c proto/auth.c
