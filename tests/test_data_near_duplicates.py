"""bench.quality.data.near_duplicates (shingle resemblance, groups), the grouped stratified split, and the
``dedupe: near`` data setting of the ``text`` and ``retrieval`` tasks on the real BBC corpus."""

from __future__ import annotations

import numpy as np
import pytest

from bench.quality.data import bbc
from bench.quality.data.errors import DataMissingError
from bench.quality.data.near_duplicates import (
    DEFAULT_THRESHOLD,
    near_duplicate_groups,
    normalise,
    resemblance_pairs,
    title_of,
    word_shingles,
)
from bench.quality.data.splits import SPLIT_NAMES, split_groups_stratified, split_indices

ORIGINAL = """Ministers unveil plan to rebuild coastal railway

The government has announced a five-year plan to rebuild the coastal railway line that was
washed away by winter storms, with the first trains expected to run again next spring.
Transport officials said engineers would begin work on the sea wall in March, before laying new
track along the most exposed stretch between the two harbour towns. Local businesses, which say
they have lost trade since the line closed, welcomed the news but warned that the timetable was
ambitious. The plan will be paid for from the national infrastructure budget, the minister
told reporters on Tuesday."""

#: ORIGINAL with four words changed, punctuation, case and spacing altered.
REWORDED = """MINISTERS UNVEIL PLAN TO REBUILD COASTAL RAILWAY!

The government has confirmed a five-year plan to rebuild the coastal railway line that was
washed away by winter storms -- with the first trains expected to run again next spring...
Transport officials said builders would begin work on the sea wall in April; before laying new
track along the most exposed stretch between the two harbour towns.  Local firms, which say
they have lost trade since the line closed, welcomed the news, but warned that the timetable
was ambitious. The plan will be paid for from the national infrastructure budget, the minister
told reporters on Tuesday"""

UNRELATED = [
    """Striker signs new contract

The club's top scorer has agreed a new three-year deal, ending weeks of speculation about a move
abroad. The manager said he was delighted that the player had committed his future to the club
and that the squad would be strengthened further in the summer.""",
    """Chip maker reports record profits

Quarterly profits at the world's largest maker of memory chips rose by a third, helped by strong
demand for phones and laptops. The firm said it expected sales to slow in the new year as prices
fell and customers worked through their stocks.""",
    """Film festival opens with comedy

A comedy about two brothers running a seaside hotel has opened this year's film festival. The
director told the audience that the story was based on his own family and that most of the cast
had never acted before.""",
]


def test_normalisation_and_shingles() -> None:
    assert normalise("Labour's  'EU propaganda'\n-- now!") == "labour s eu propaganda now"
    assert normalise("ÉTÉ\tété") == "été été"
    assert title_of("\n  Big News: Today \n\nbody") == "big news today"
    assert word_shingles("A b, C d!", 3) == ["a b c", "b c d"]
    assert word_shingles("Two words", 3) == ["two words"]  # a short text is one shingle


def test_a_reworded_copy_is_grouped_with_its_original() -> None:
    texts = [UNRELATED[0], ORIGINAL, UNRELATED[1], REWORDED, UNRELATED[2]]
    first, second, resemblance = resemblance_pairs(texts, 0.05)
    assert (first.tolist(), second.tolist()) == ([1], [3])
    assert DEFAULT_THRESHOLD < resemblance[0] < 1
    groups = near_duplicate_groups(texts)
    assert groups.dtype == np.int64 and groups.shape == (5,)
    assert groups.tolist() == [0, 1, 2, 1, 3]  # numbered by first appearance
    # the title rule alone: a changed body, the same title (other case and punctuation)
    retitled = "ministers unveil plan to rebuild coastal railway.\n\n" + UNRELATED[0].split("\n", 2)[2]
    assert near_duplicate_groups([ORIGINAL, retitled]).tolist() == [0, 0]
    assert near_duplicate_groups([ORIGINAL, retitled], match_titles=False).tolist() == [0, 1]


def test_unrelated_texts_are_not_grouped() -> None:
    texts = [*UNRELATED, ORIGINAL]
    assert near_duplicate_groups(texts).tolist() == [0, 1, 2, 3]
    assert near_duplicate_groups([]).shape == (0,)


def test_groups_are_connected_components() -> None:
    words = [f"w{i}" for i in range(120)]
    a, b, c = (" ".join(words[start : start + 60]) for start in (0, 30, 60))  # a~b, b~c, a!~c
    assert resemblance_pairs([a, c], 0.01)[0].size == 0
    assert near_duplicate_groups([a, b, c], 0.25, match_titles=False).tolist() == [0, 0, 0]
    assert near_duplicate_groups([a, c, b], 0.25, match_titles=False).tolist() == [0, 0, 0]
    assert near_duplicate_groups([a, b, c], 0.5, match_titles=False).tolist() == [0, 1, 2]


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match=r"threshold: must be a number in \(0, 1\]; got 0"):
        near_duplicate_groups(["a"], threshold=0)
    with pytest.raises(ValueError, match="shingle_size"):
        near_duplicate_groups(["a"], shingle_size=0)
    with pytest.raises(ValueError, match="stratify"):
        split_groups_stratified([0, 1, 2], [0, 1], seed=0)


def test_grouped_stratified_split() -> None:
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 700, size=1000)  # mostly singletons, some pairs and triples
    labels = rng.integers(0, 5, size=1000)
    parts = split_groups_stratified(groups, labels, seed=3)
    assert tuple(parts) == SPLIT_NAMES
    everything = np.concatenate(list(parts.values()))
    assert np.array_equal(np.sort(everything), np.arange(1000))
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts.values())
    seen = [set(groups[p].tolist()) for p in parts.values()]
    assert not seen[0] & seen[1] and not seen[0] & seen[2] and not seen[1] & seen[2]
    for index in parts.values():  # class proportions kept up to a few items
        share = np.bincount(labels[index], minlength=5) / np.bincount(labels, minlength=5)
        assert np.allclose(share, len(index) / 1000, atol=0.04)
    again, other = split_groups_stratified(groups, labels, seed=3), split_groups_stratified(groups, labels, seed=4)
    assert all(np.array_equal(parts[k], again[k]) for k in SPLIT_NAMES)
    assert not np.array_equal(parts["test"], other["test"])


# --- the real corpus ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], np.ndarray]:
    try:
        return bbc.load_articles()
    except DataMissingError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def articles_256(corpus) -> tuple[dict[bytes, int], dict[int, int]]:
    """For 256-byte inputs: the corpus index of each distinct input row (as the tasks encode
    it), and the near-duplicate group of each of those articles (computed here, once)."""
    texts, _ = corpus
    ids, _ = bbc.encode_bytes(texts, 256)
    keep = bbc.distinct_rows(ids)
    groups = near_duplicate_groups([texts[i] for i in keep])
    return {ids[i].tobytes(): int(i) for i in keep}, dict(zip(keep.tolist(), groups.tolist()))


def _straddling(groups: dict[int, int], train: set[int], held_out: set[int]) -> set[int]:
    """Held-out articles (corpus indices) in a near-duplicate group with a training article."""
    train_groups = {groups[i] for i in train}
    return {i for i in held_out if groups[i] in train_groups}


def test_text_task_keeps_near_duplicates_out_of_val_and_test(articles_256) -> None:
    from bench.quality.tasks import get_task

    article, groups = articles_256
    task = get_task("text", {"seq_len": 256, "data_seed": 0, "dedupe": "near"}, seed=0)
    task.prepare()
    rows = {split: {article[r.tobytes()] for r in task.splits[split]["ids"].numpy()} for split in SPLIT_NAMES}
    assert sum(len(v) for v in rows.values()) == len(article)  # every distinct article, once
    for split in ("val", "test"):
        assert not _straddling(groups, rows["train"], rows[split]), split
    # what the old article-by-article split let through
    old = get_task("text", {"seq_len": 256, "data_seed": 0}, seed=0)
    assert old.dedupe == "exact"
    old.prepare()
    old_rows = {split: {article[r.tobytes()] for r in old.splits[split]["ids"].numpy()} for split in SPLIT_NAMES}
    assert len(_straddling(groups, old_rows["train"], old_rows["test"])) >= 5


def test_retrieval_task_keeps_near_duplicates_out_of_val_and_test(articles_256) -> None:
    from bench.quality.tasks import get_task

    article, groups = articles_256
    data = {"seq_len": 256, "train_pairing": "in_batch", "val_pairs": 400, "test_pairs": 800, "data_seed": 0,
            "dedupe": "near"}
    task = get_task("retrieval", data, seed=0)
    task.prepare()
    train = {article[r.tobytes()] for r in task.articles["ids"].numpy()}
    for split in ("val", "test"):
        pairs = task.splits[split]
        held_out = {article[r.tobytes()] for key in ("ids", "pair_ids") for r in pairs[key].numpy()}
        assert held_out and not held_out & train
        assert not _straddling(groups, train, held_out), split


def test_near_splits_are_deterministic_for_a_data_seed(corpus) -> None:
    texts, labels = corpus
    ids, _ = bbc.encode_bytes(texts, 256)
    keep, parts = bbc.split_articles(texts, labels, ids, seed=0, dedupe="near")
    again_keep, again = bbc.split_articles(texts, labels, ids, seed=0, dedupe="near")
    assert np.array_equal(keep, again_keep) and np.array_equal(keep, bbc.distinct_rows(ids))
    assert all(np.array_equal(parts[k], again[k]) for k in SPLIT_NAMES)
    _, other = bbc.split_articles(texts, labels, ids, seed=1, dedupe="near")
    assert not np.array_equal(parts["test"], other["test"])
    assert [len(parts[k]) for k in SPLIT_NAMES] == [1686, 210, 210]
    # "exact" is the split every run used before the setting existed
    _, exact = bbc.split_articles(texts, labels, ids, seed=0)
    before = split_indices(keep.size, seed=0, stratify=labels[keep])
    assert all(np.array_equal(exact[k], before[k]) for k in SPLIT_NAMES)


@pytest.mark.parametrize("task_name", ["text", "retrieval"])
def test_an_unknown_dedupe_value_is_named(task_name: str) -> None:
    from bench.quality.tasks import get_task

    task = get_task(task_name, {"seq_len": 64, "data_seed": 0, "dedupe": "fuzzy"}, seed=0)
    expected = f"{task_name}: data setting 'dedupe': unknown value 'fuzzy'; allowed values are ['exact', 'near']"
    with pytest.raises(ValueError) as info:
        task.prepare()  # checked before the corpus is read
    assert str(info.value) == expected
    with pytest.raises(ValueError, match="dedupe: unknown value 'Near'"):
        bbc.split_articles(["a"], np.zeros(1, np.int64), np.zeros((1, 4), np.int64), seed=0, dedupe="Near")
