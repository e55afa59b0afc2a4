"""Model instances: threads and processes, the process's channel, worker and supervisor, devices."""
