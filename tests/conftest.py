import os
import tempfile

# Partitions cached by the tests (and the subprocesses they start) stay out of the user's cache.
os.environ["TUNER_CACHE"] = tempfile.mkdtemp(prefix="tuner-test-cache-")
