"""Generated protobuf and gRPC code (tools/gen_proto.py); do not edit."""
