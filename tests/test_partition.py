from pathlib import Path

import numpy as np
import pytest

from tuner.data import partition as P
from tuner.data.partition import PartitionSpec, parse_partition, partition
from tuner.errors import UserError

LABELS = np.repeat(np.arange(10), 3000)  # 10 classes x 3000 samples


def spec(kind, value, clients=20, **kw):
    return PartitionSpec(kind=kind, value=value, clients=clients, seed=1, **kw)


def all_indices(p):
    return np.concatenate(p.train + p.test + p.val)


def class_counts(idx):
    return np.bincount(LABELS[idx], minlength=10)


def test_no_sample_is_used_twice_and_splits_are_75_25():
    for s in (spec("iid", None), spec("pat", 2), spec("dir", 0.1), spec("pac", 20, pac_train=300, pac_test=100)):
        p = partition(LABELS, 10, s)
        idx = all_indices(p)
        assert len(idx) == len(np.unique(idx)), s.kind
    p = partition(LABELS, 10, spec("dir", 0.5))
    for tr, te in zip(p.train, p.test, strict=True):
        n = len(tr) + len(te)
        assert len(tr) == int(round(0.75 * n))


def test_validation_is_carved_from_train():
    p = partition(LABELS, 10, spec("iid", None, val_frac=0.2))
    for tr, va, te in zip(p.train, p.val, p.test, strict=True):
        assert len(va) == int(round(0.2 * (len(tr) + len(va))))
        assert len(te) == 375  # 1500 per client, 25 %


def test_another_validation_draw_keeps_the_partition_and_its_sizes_and_changes_only_which_samples_validate():
    """val_seed: another draw of each client's validation samples from the same training part (what a tuned
    comparison's second and third searches validate on); None keeps the carve, and the cache key, as they were."""
    base = spec("dir", 0.5, val_frac=0.2)
    carved = partition(LABELS, 10, base)
    drawn = [partition(LABELS, 10, spec("dir", 0.5, val_frac=0.2, val_seed=s)) for s in (1, 2)]
    for d in drawn:
        for i in range(20):
            assert np.array_equal(d.test[i], carved.test[i]) and len(d.val[i]) == len(carved.val[i])
            assert np.array_equal(
                np.sort(np.concatenate([d.train[i], d.val[i]])),
                np.sort(np.concatenate([carved.train[i], carved.val[i]])),
            )
            assert not set(d.val[i]) & set(d.train[i])
        assert any(not np.array_equal(d.val[i], carved.val[i]) for i in range(20))
    assert any(not np.array_equal(drawn[0].val[i], drawn[1].val[i]) for i in range(20))
    assert base.key("x", 1) == spec("dir", 0.5, val_frac=0.2, val_seed=None).key("x", 1) != drawn_key(1)


def drawn_key(val_seed):
    return spec("dir", 0.5, val_frac=0.2, val_seed=val_seed).key("x", 1)


def test_pathological_gives_exactly_n_classes_per_client():
    for n in (1, 2, 3):
        p = partition(LABELS, 10, spec("pat", n))
        for tr, te in zip(p.train, p.test, strict=True):
            assert (class_counts(np.concatenate([tr, te])) > 0).sum() == n
    balanced = partition(LABELS, 10, spec("pat", 2, balance=True))
    sizes = [len(a) + len(b) for a, b in zip(balanced.train, balanced.test, strict=True)]
    assert max(sizes) - min(sizes) <= 2
    unbalanced = partition(LABELS, 10, spec("pat", 2))
    sizes = [len(a) + len(b) for a, b in zip(unbalanced.train, unbalanced.test, strict=True)]
    assert max(sizes) > 1.5 * min(sizes)


def test_dirichlet_concentration_controls_skew():
    def top_share(beta):
        p = partition(LABELS, 10, spec("dir", beta, clients=10))
        shares = [
            class_counts(np.concatenate([a, b])).max() / (len(a) + len(b)) for a, b in zip(p.train, p.test, strict=True)
        ]
        return np.mean(shares)

    assert top_share(0.1) > 0.5  # a few classes dominate each client
    assert top_share(100.0) < 0.2  # close to uniform (0.1)
    p = partition(LABELS, 10, spec("dir", 0.1, min_samples=150))
    assert min(len(a) + len(b) for a, b in zip(p.train, p.test, strict=True)) >= 150


def test_pac_groups_dominant_classes_and_fixed_sizes():
    p = partition(LABELS, 10, spec("pac", 20, pac_train=300, pac_test=200))
    dominant = P.pac_dominant_classes(10, 5, None)
    assert dominant[0] == [0, 1, 2] and dominant[4] == [8, 9, 0]
    shares = []
    for i, (tr, te) in enumerate(zip(p.train, p.test, strict=True)):
        assert len(tr) == 300 and len(te) == 200
        assert p.group[i] == i % 5
        counts = class_counts(tr)
        shares.append(counts[dominant[i % 5]].sum() / 300)
        # test follows the same distribution: its dominant share is close to the train one
        assert abs(class_counts(te)[dominant[i % 5]].sum() / 200 - shares[-1]) < 0.12
    # 80 % from the three dominant classes plus their part of the 20 % uniform: 0.8 + 0.2 * 3/10, exactly
    assert np.allclose(shares, 0.86)


def test_pac_counts_and_reuse_follow_fedpacs_code():
    assert P.pac_counts(600, 0.2, 10, [0, 1, 2]).tolist() == [172, 172, 172, 12, 12, 12, 12, 12, 12, 12]
    emnist = P.pac_counts(1000, 0.2, 62, list(range(10)))  # 200 uniform: 3 per class, the last class 17
    assert emnist.sum() == 1000 and emnist[10] == 3 and emnist[61] == 17 and emnist[9] == 3 + 80
    p = partition(LABELS, 10, spec("pac", 20, clients=100, pac_train=600, pac_test=600))  # more than the data: reused
    assert all(
        len(tr) == 600 and len(te) == 600 and len(set(tr)) == 600 for tr, te in zip(p.train, p.test, strict=True)
    )
    assert not set(np.concatenate(p.train)) & set(np.concatenate(p.test))  # nobody's test sample is trained on
    assert len(np.concatenate(p.train)) > len(set(np.concatenate(p.train)))


def test_impossible_requests_are_refused():
    with pytest.raises(UserError, match="classes per client"):
        partition(LABELS, 10, spec("pat", 11))
    with pytest.raises(UserError, match="fewer clients"):
        partition(LABELS[:500], 10, spec("dir", 0.1, clients=20, min_samples=40))
    with pytest.raises(UserError, match="use smaller pac_train"):
        partition(LABELS, 10, spec("pac", 0, clients=5, pac_train=9000, pac_test=600))
    for bad in ("dir", "zipf:2"):
        with pytest.raises(UserError, match="not understood"):
            parse_partition(bad)
    for bad, allowed in (
        ("dir:-1", "above 0"),
        ("pat:1.5", "per client, at least 1"),
        ("pat:0", "at least 1"),
        ("pac:120", "from 0 to 100"),
    ):
        with pytest.raises(UserError, match=f"{bad}'.*{allowed}, not {bad.split(':')[1]}"):  # the range its kind allows
            parse_partition(bad)
    assert parse_partition("pac:0") == ("pac", 0.0)  # every sample from the dominant classes: a value, allowed


def test_partitions_are_seeded_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "CACHE_ROOT", tmp_path)
    a = partition(LABELS, 10, spec("dir", 0.3), dataset="synthetic")
    assert len(list(tmp_path.glob("synthetic-dir-*.npz"))) == 1
    b = partition(LABELS, 10, spec("dir", 0.3), dataset="synthetic")  # from the cache
    c = partition(LABELS, 10, spec("dir", 0.3))  # recomputed with the same seed
    for x, y, z in zip(a.train, b.train, c.train, strict=True):
        assert np.array_equal(x, y) and np.array_equal(x, z)
    partition(LABELS, 10, spec("dir", 0.3, train_frac=0.8), dataset="synthetic")
    assert len(list(tmp_path.glob("synthetic-dir-*.npz"))) == 2  # every shaping setting is in the key


def _save_many(path: str, start, times: int) -> None:
    start.wait()  # every writer begins at once
    p = partition(LABELS, 10, spec("dir", 0.3))
    for _ in range(times):
        P._save(Path(path), p)


def test_trials_that_cache_one_partition_together_never_trip_over_each_other(tmp_path):
    """Four processes write the same cache file at once, as trials starting together on an empty cache do:
    each through a temporary file of its own, so none fails and the file is always whole."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    start = context.Event()
    path = tmp_path / "synthetic-dir-shared.npz"
    writers = [context.Process(target=_save_many, args=(str(path), start, 40)) for _ in range(4)]
    for w in writers:
        w.start()
    start.set()
    for w in writers:
        w.join(timeout=120)
    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    whole = P._load(path, 20)
    assert sum(map(len, whole.train)) + sum(map(len, whole.test)) == len(LABELS)
    assert not list(tmp_path.glob("*.tmp*"))  # no temporary file left behind


def test_a_partition_kind_registered_in_partition_py_alone_runs_and_is_refused_out_of_range(tmp_path, monkeypatch):
    """The map's promise (docs/architecture.md): a partition touches tuner/data/partition.py alone. A toy kind,
    `sorted:N` (the samples in label order, dealt out in N-sample blocks, client after client), registered in
    PARTITIONS and nowhere else, is taken by `tuner run`, checked against its range, and split as it says."""
    from cli_runs import invoke

    from tuner.data import partition as partitions

    def sorted_blocks(labels, num_classes, spec, rng):
        order, block = np.argsort(labels, kind="stable"), int(spec.value)
        return [order[i * block : (i + 1) * block] for i in range(spec.clients)]

    kind = partitions.PartitionKind("sorted:N", "a block size of at least 10", lambda v: v >= 10, sorted_blocks)
    monkeypatch.setitem(partitions.PARTITIONS, "sorted", kind)
    run = ["--dataset", "digits", "--clients", "4", "--rounds", "1", "--set", "backbone=mlp"]
    res = invoke("run", "fedavg", "--partition", "sorted:100", *run, "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output
    refused = invoke("run", "fedavg", "--partition", "sorted:5", *run, "--out", tmp_path / "small")
    assert refused.exit_code == 2 and "sorted's value must be a block size of at least 10, not 5" in refused.output
    split = partitions.partition(np.repeat(np.arange(10), 40), 10, PartitionSpec("sorted", 100, clients=4, seed=0))
    assert [len(t) + len(e) for t, e in zip(split.train, split.test, strict=True)] == [100] * 4
    first = np.concatenate([split.train[0], split.test[0]])
    assert set(np.repeat(np.arange(10), 40)[first]) == {0, 1, 2}  # the first block: the lowest labels


def test_a_validation_draw_without_a_validation_split_is_one_sentence():
    from tuner.settings.config import resolve_layers

    with pytest.raises(UserError, match=r"val_seed \(1\) draws the validation split: .* with val_frac above 0"):
        resolve_layers("fedavg", [("test", {"dataset": "digits", "val_seed": 1})])
