"""Six sites, four classes, each site seeing two of them: the data of docs/own_code.md's worked example.
Writes sites.parquet in the current directory: one row per sample, `x` (16 features), `y`, `client`."""

import numpy as np
import pandas as pd

rng = np.random.default_rng(0)
y = rng.integers(0, 4, 600)
x = rng.normal(size=(600, 16))
x[np.arange(600), y] += 2  # the features carry the class
client = (3 * y + rng.integers(0, 3, 600)) % 6  # sites 0-2 see classes 0 and 2, sites 3-5 classes 1 and 3
pd.DataFrame({"x": list(x), "y": y, "client": client}).to_parquet("sites.parquet")
