"""tiny's device conformance kit: test modules collected by `pytest --tiny-device=NAME --tiny-conformance`.

Every test runs on the device under test (the `tiny_device` fixture) and compares against numpy; a few also against
the PYTHON device, tiny's reference interpreter. Shapes are small so the kit runs quickly even on PYTHON.
"""
