"""The listening side shared by HTTP and gRPC: sockets, TLS, restricted endpoints, the request budget."""
