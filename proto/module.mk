# Wire protocol: framing, codec, authentication. Pure code, no I/O.
# proto/realnum.cc is C++ for fast_float's header; it needs no C++ runtime.
PROTO_SRCS := proto/codec.c proto/fastbeat.c proto/realnum.cc proto/check.c proto/auth.c proto/channel.c
