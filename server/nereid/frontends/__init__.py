"""Front-end workers: several processes serve the HTTP port, one process schedules.

nereid in one process parses and answers every request on one event loop, under one
GIL: about one core's worth of small requests. ``--http-workers N`` (N > 1) moves the
front end into N worker processes while every model version keeps exactly one scheduler
(its batcher, queue and instances) in the main process, so a batch still holds requests
that arrived through any worker; N copies of the whole server (uvicorn's ``--workers``)
would load every model N times and split every batch N ways.

    client --TCP--> worker i (native HTTP/1.1 engine, its own event loop and GIL)
      infer:     body -> arena i (shared memory, reused) + INFER message (socket pair)
                 main: WorkerLink -> Endpoints.start_infer -> ServingModel.submit
                       (the same queue as everyone's) -> batch -> answer
                 answer body -> arena i + ANSWER message -> worker writes the response
      any other: forwarded whole to the main app (ASGI), answered back in parts:
                 health, metadata, config, statistics, model control, repository
                 index, shared-memory registration and generate behave as one server's

The main process binds the port (one SO_REUSEPORT socket per worker, or one socket they
share) and keeps the sockets, the models, gRPC and the metrics port; statistics and
metrics are counted once, there. A worker that dies is restarted on its socket (its
requests in flight fail with their connections; nobody else's); SIGTERM drains the
workers, then the main process. ``--http-workers 1`` (the default) is the server as it
always was: no worker, no extra hop.

Modules: ``arena`` (the shared region and its ring), ``messages`` (control messages and
their framing), ``forwarding`` (the worker's side), ``worker`` (the worker process),
``link`` (the main process's side of one worker), ``supervisor`` (the workers' life).

This first step parses infer bodies in the main process (workers own connections, HTTP
framing and limits); next: decode and encode tensors in the workers with the model
tables the main process sends them, answer health and metadata there from shared state,
serve gRPC through the workers too, and hold the connection and body limits server-wide.
"""

from nereid.frontends.supervisor import FrontEnds

__all__ = ["FrontEnds"]
