"""Triton's KServe v2 gRPC surface: ``inference.GRPCInferenceService`` (service.py) over
the one infer flow (codec.py), on the server's event loop."""
