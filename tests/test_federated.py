import numpy as np
import torch

from tuner.data.dataset import Dataset
from tuner.data.federated import build
from tuner.data.partition import PartitionSpec, partition

N_PER_CLASS = 300
LABELS = np.repeat(np.arange(10), N_PER_CLASS)
IMAGES = torch.zeros(len(LABELS), 1, 8, 8, dtype=torch.uint8)
IMAGES[:, 0, :, 0] = 255  # a bright left column: rotating the image moves it
DATASET = Dataset("synthetic", IMAGES, torch.from_numpy(LABELS), 10, "image")
PART = partition(LABELS, 10, PartitionSpec("pac", 20, clients=10, seed=0, pac_train=60, pac_test=20, val_frac=0.25))


def test_client_tensors_follow_the_partition():
    data = build(DATASET, PART, "none", 0, "half", torch.device("cpu"))
    assert data.train.counts == [45] * 10 and data.val.counts == [15] * 10 and data.test.counts == [20] * 10
    x, y = data.train.client(3)
    assert torch.equal(y, torch.from_numpy(LABELS[PART.train[3]]))
    assert data.label_counts().sum() == 450
    index, mask = data.test.padded_index(torch.tensor([1, 2]), start=10, width=16)
    assert mask.sum(1).tolist() == [10, 10] and index[0, 0].item() == data.test.offsets[1] + 10


def test_concept_shift_permutes_labels_per_group():
    plain = build(DATASET, PART, "none", 0, "half", torch.device("cpu"))
    shifted = build(DATASET, PART, "concept", 0, "half", torch.device("cpu"))
    for i in range(10):
        a, b = plain.train.client(i)[1], shifted.train.client(i)[1]
        if PART.group[i] == 0:
            assert torch.equal(a, b)
        else:  # the same samples, relabelled by one fixed permutation of the group
            mapping = {(int(u), int(v)) for u, v in zip(a, b, strict=True)}
            assert len(mapping) == len({u for u, _ in mapping}) and any(u != v for u, v in mapping)
    same_group = [i for i in range(10) if PART.group[i] == 1]
    maps = [
        dict(zip(plain.train.client(i)[1].tolist(), shifted.train.client(i)[1].tolist(), strict=True))
        for i in same_group
    ]
    shared = set(maps[0]) & set(maps[1])
    assert shared and all(maps[0][c] == maps[1][c] for c in shared)


def test_feature_skew_rotates_images_per_group():
    data = build(DATASET, PART, "rotate", 0, "half", torch.device("cpu"))
    for i in range(10):
        x = data.train.client(i)[0][0, 0]
        if PART.group[i] == 0:
            assert x[:, 0].eq(255).all()
        else:
            assert not x[:, 0].eq(255).all()
