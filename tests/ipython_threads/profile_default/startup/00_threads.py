# IPython startup file for `make test-portable` (IPYTHONDIR=tests/ipython_threads): the
# notebook kernel computes with COURSE_TEST_THREADS intra-op threads. torch caps
# OMP_NUM_THREADS at the number of cores, and float32 sums split over more threads than
# cores add up in another order (e.g. 4 on a 2-core machine): that is what we want here.
import os

if os.environ.get("COURSE_TEST_THREADS"):
    import torch

    torch.set_num_threads(int(os.environ["COURSE_TEST_THREADS"]))
