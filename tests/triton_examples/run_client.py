import os, runpy, sys
http_port, grpc_port, script = sys.argv[1], sys.argv[2], sys.argv[3]
import tritonclient.http, tritonclient.grpc
for module, default, port in ((tritonclient.http, ":8000", http_port), (tritonclient.grpc, ":8001", grpc_port)):
    original = module.InferenceServerClient.__init__
    def init(self, url, *args, _original=original, _default=default, _port=port, **kwargs):
        _original(self, url.replace(_default, ":" + _port), *args, **kwargs)
    module.InferenceServerClient.__init__ = init
metrics_port = os.environ.get("TRITON_EXAMPLE_METRICS_PORT")
if metrics_port:  # the custom_metrics client reads the metrics port with requests
    import requests.sessions
    original_request = requests.sessions.Session.request
    def request(self, method, url, *args, **kwargs):
        return original_request(self, method, url.replace(":8002", ":" + metrics_port), *args, **kwargs)
    requests.sessions.Session.request = request
sys.argv = [script] + sys.argv[4:]
runpy.run_path(script, run_name="__main__")
