"""One model's scheduling: the request queue, the dynamic batcher, pending answers, time."""
