"""Metadata, allocator, cache poisoning and the two paged-attention backends."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="gpu_checks need torch")

from pytest_cbatch.gpu_checks.attention import run_attention_parity  # noqa: E402
from pytest_cbatch.gpu_checks.paged import (  # noqa: E402
    BlockAllocator, KVCache, PoolExhausted, RowSpec, build_metadata, paged_attention,
)


def test_metadata_matches_the_engine_contract() -> None:
    rows = [RowSpec(5, 1, (7, 3)), RowSpec(0, 3, (2,)), RowSpec(3, 2, (9, 11))]
    m = build_metadata(rows, block_size=4, device="cpu", pad_to=8)
    assert m.positions.tolist() == [5, 0, 1, 2, 3, 4, 0, 0]
    assert m.query_start_loc.tolist() == [0, 1, 4, 6]
    assert m.seq_lens.tolist() == [6, 3, 5]
    assert m.block_table.tolist() == [[7, 3], [2, 0], [9, 11]]
    # slot = page * block_size + position % block_size; padding writes nowhere (-1)
    assert m.slot_mapping.tolist() == [13, 8, 9, 10, 39, 44, -1, -1]
    assert m.num_actual_tokens == 6


def test_metadata_refuses_rows_without_pages() -> None:
    with pytest.raises(ValueError):
        build_metadata([RowSpec(4, 1, (1,))], block_size=4, device="cpu")


def test_allocator_never_hands_out_the_null_page_and_reuses_freed_pages_first() -> None:
    alloc = BlockAllocator(6, seed=0)
    pages = [alloc.allocate() for _ in range(5)]
    assert sorted(pages) == [1, 2, 3, 4, 5]
    with pytest.raises(PoolExhausted):
        alloc.allocate()
    alloc.release([pages[2]])
    assert alloc.allocate() == pages[2]
    assert BlockAllocator(40, seed=1).free_list != BlockAllocator(40, seed=2).free_list


def test_cache_is_poisoned_at_init_and_on_free() -> None:
    cache = KVCache(1, 3, 2, 1, 2, torch.float32, "cpu", poison=100.0)
    assert bool((cache.data == 100.0).all())
    cache.write(0, torch.zeros(2, 1, 2), torch.zeros(2, 1, 2), torch.tensor([2, 3]))
    assert bool((cache.data[:, :, 1] == 0).all())
    cache.poison_blocks([1])
    assert bool((cache.data == 100.0).all())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_backend_parity_on_ragged_paged_batches(dtype: str) -> None:
    result = run_attention_parity(dtype)
    assert result.passed, result.summary()


def _random_case(align: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    rows = [RowSpec(6, 3, (4, 1, 3)), RowSpec(0, 5, (2, 5))]
    meta = build_metadata(rows, block_size=4, device="cpu")
    q = torch.randn(8, 4, 8, generator=g, dtype=torch.float64)
    kc, vc = torch.randn(6, 4, 2, 8, generator=g, dtype=torch.float64), torch.randn(6, 4, 2, 8, generator=g,
                                                                                    dtype=torch.float64)
    return (paged_attention(q, kc, vc, meta, backend="loop", align=align),
            paged_attention(q, kc, vc, meta, backend="sdpa", align=align))


def test_backends_agree_on_the_top_left_variant_and_it_differs() -> None:
    loop_br, sdpa_br = _random_case("bottom_right")
    loop_tl, sdpa_tl = _random_case("top_left")
    assert torch.allclose(loop_tl, sdpa_tl, atol=1e-12)
    assert torch.allclose(loop_br, sdpa_br, atol=1e-12)
    assert not torch.allclose(loop_br[:3], loop_tl[:3], atol=1e-3)   # the chunk with context moves
    assert torch.allclose(loop_br[3:], loop_tl[3:], atol=1e-12)      # a fresh prefill does not


def test_unknown_backend_or_alignment_is_refused() -> None:
    meta = build_metadata([RowSpec(0, 1, (1,))], block_size=4, device="cpu")
    q, cache = torch.ones(1, 2, 4), torch.ones(2, 4, 1, 4)
    with pytest.raises(ValueError):
        paged_attention(q, cache, cache, meta, backend="flash")
    with pytest.raises(ValueError):
        paged_attention(q, cache, cache, meta, align="middle")
