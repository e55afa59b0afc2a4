import runpy, sys
http_port, grpc_port, script = sys.argv[1], sys.argv[2], sys.argv[3]
import tritonclient.http, tritonclient.grpc
for module, default, port in ((tritonclient.http, ":8000", http_port), (tritonclient.grpc, ":8001", grpc_port)):
    original = module.InferenceServerClient.__init__
    def init(self, url, *args, _original=original, _default=default, _port=port, **kwargs):
        _original(self, url.replace(_default, ":" + _port), *args, **kwargs)
    module.InferenceServerClient.__init__ = init
sys.argv = [script] + sys.argv[4:]
runpy.run_path(script, run_name="__main__")
