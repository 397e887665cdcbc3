"""Stand-ins for what this machine lacks or a test must control: the TensorRT and cuda-python
bindings (tensorrt.py; tensorrt_site/ installs it in a daemon and its workers), NVIDIA's MPS
control tool (bin/), and plugins that misbehave on purpose (plugins/, on the daemon's PYTHONPATH)."""
