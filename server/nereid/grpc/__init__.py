"""Triton's KServe v2 gRPC surface: ``inference.GRPCInferenceService`` (service.py) with
ModelInfer's one path (infer.py), served by nereid's own HTTP/2 (native.py over h2/) or by
grpcio (grpcio_server.py), on the server's event loop."""
