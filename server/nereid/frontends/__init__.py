"""Front-end workers: several processes serve the HTTP and gRPC ports, one process schedules.

nereid in one process parses and answers every request on one event loop, under one
GIL: about one core's worth of small requests. ``--http-workers N`` (N > 1) moves the
front end into N worker processes while every model version keeps exactly one scheduler
(its batcher, queue and instances) in the main process, so a batch still holds requests
that arrived through any worker; N copies of the whole server (uvicorn's ``--workers``)
would load every model N times and split every batch N ways.

    client --TCP--> worker i (native HTTP/1.1 engine, its own event loop and GIL)
      infer:     parsed and checked in the worker (the same tables, rules and memo as
                 the main process, for the model version the main process announced)
                 -> input tensors into arena i (shared memory, reused) + a DECODED
                 message (socket pair; the request's template is sent once, then named
                 by number)
                 main: WorkerLink -> InferRequest of views on the arena (no copy)
                       -> ServingModel.submit_bundle (a frame's requests of one template
                       as one entry of all their rows, up to the model's largest batch,
                       in the same queue as everyone's, counted one by one; where the
                       model could tell -- execute(requests), batch_size(), a bounded
                       queue, preserve_ordering, no dynamic batching -- submit_many: each
                       its own entry)
                       -> batch
                 outputs -> arena i + RESULTS (the outputs of every request answered
                 in one loop turn joined in one block, one message) -> the worker
                 encodes and writes each answer
                 (what the worker cannot decode -- a model not yet announced, a version
                 named in the URL, compressed or heavy bodies, client shared memory,
                 BYTES tensors, sequence parameters, a bad request -- goes as a raw body, INFER, and the main
                 process's own infer flow takes it: Endpoints.start_infer)
      health, metadata, config: answered in the worker by the main app's own handlers
                 (http.endpoints.Lookups) from the main process's picture of the
                 models (models.directory.Directory), sent as it changes (DIRECTORY
                 messages); a shared generation counter stops a worker from answering
                 from a picture older than a change the main process confirmed, and
                 readiness of versions whose instances can falter on their own is
                 asked of the main process (directory_sync, local_answers)
      statistics: answered in the worker by the same handlers from every served
                 version's figures, which the main process keeps in a table in shared
                 memory (shared_stats): it writes what changed just before it writes
                 anything to any worker, so an answer's request is counted there before
                 the answer leaves; read under a sequence counter and the generation
                 (shared_stats); gRPC's ModelStatistics likewise (grpc_calls)
      any other: forwarded whole to the main app (ASGI), answered back in parts:
                 model control, repository index, shared-memory registration and
                 generate behave as one server's
    client --gRPC--> worker i (native HTTP/2 engine on the gRPC port)
      ModelInfer: decoded in the worker (the main process's gRPC decoder and memo, same
                 conditions as HTTP's) -> arena + DECODED, as above; the outputs come
                 back in RESULTS and are encoded into the ModelInferResponse there
      any other call (ModelStreamInfer included, and a ModelInfer not decoded): relayed
                 whole -- headers, messages, end, reset -- into the main process's
                 NativeGrpcServer (grpc_link.RelayedConnection stands for the client's
                 connection there), its response messages and status relayed back

The main process binds the port (one SO_REUSEPORT socket per worker, or one socket they
share; the gRPC port likewise when gRPC is native and plaintext) and keeps the sockets,
the models and the metrics port; statistics and metrics are counted once, there. When it
serves the gRPC port itself (TLS, grpcio) it answers infer requests there with no worker
in between, so the workers forward statistics then (no table). A worker that dies is restarted on its socket (its
requests in flight fail with their connections; nobody else's); SIGTERM drains the
workers, then the main process. ``--http-workers 1`` (the default) is the server as it
always was: no worker, no extra hop; ``--http-workers auto`` picks N from the cores
(cli.auto_http_workers). With ``--http-use-ssl`` every worker wraps its connections with
the server's TLS settings (network/tls.py) and reads them again on SIGHUP.

Input tensors of a decoded request are views on the worker's arena until its answer is
sent: a model must not keep a reference to its inputs after ``infer`` returns (Triton's
rule too: the buffers of a released request are reused).

Modules: ``arena`` (the shared region and its ring), ``messages`` (control messages and
their framing), ``layout`` (tensors side by side in an arena block), ``decoding`` (infer
requests decoded and answers encoded in the worker), ``forwarding`` (the worker's side of
the link and the app its engine serves), ``grpc_front`` (the worker's gRPC server and
its link), ``grpc_calls`` (its calls: ModelInfer decoded, ModelStatistics answered),
``grpc_link`` (the main process's side of them), ``worker`` (the worker process),
``link`` (the main process's side of one worker), ``link_answers`` (how each request a
worker hands over is answered), ``link_results`` (the outputs of a turn, sent together), ``shared_limits`` (limits held server-wide),
``supervisor`` (the workers' life), ``directory_sync`` (the picture of the models in every
worker), ``shared_stats`` (the statistics every worker reads), ``local_answers`` (what a
worker answers itself), ``send_windows`` (streamed responses paced across the link).

The connection limits (HTTP's and gRPC's) and the request-bytes budget hold server-wide (``shared_limits``: a
row per process in shared memory, summed at each check). Streamed responses (a relayed
gRPC stream's messages, a forwarded response's body parts) are paced across the link
(``send_windows``): the main process counts each stream's bytes the worker has not yet
handed to its client's connection (the worker gives them back, CREDIT, once the client's
HTTP/2 window let them out or the HTTP/1.1 writer drained them), and the stream's writer
waits past 1 MiB for the stream or 32 MiB for the worker, as it waits on a slow client
with one process; so a client that does not read makes its worker hold a bounded amount.

Not yet: gRPC over TLS or on grpcio through the workers (the main process serves the
gRPC port then, as with one process); statistics of more than ``shared_stats.ROWS``
served versions, or of a version with more batch sizes than a row holds (forwarded).
"""

from nereid.frontends.supervisor import FrontEnds

__all__ = ["FrontEnds"]
