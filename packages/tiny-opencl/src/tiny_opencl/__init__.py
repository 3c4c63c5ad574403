"""tiny-opencl: the OpenCL device `GPU` for tiny. Installing this package is all it takes: tiny finds it through its entry point."""
__version__ = "0.1.0"
