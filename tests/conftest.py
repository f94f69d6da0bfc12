import os

# NumPy's OpenBLAS threads otherwise spin on the 2-core CI machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
