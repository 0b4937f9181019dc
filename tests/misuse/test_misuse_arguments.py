"""Arguments of the manager and the hash helpers that were accepted silently
(truncated, wrapped) or refused with a message that named nothing: each now a
TypeError or ValueError naming the argument, nothing changed."""
import pytest
import torch

import ukv_torch
from support.transfer_pools import Pool, prefilled


def state(mgr):
    return mgr.torch_object.__getstate__()


@pytest.mark.parametrize("seq_id", [2**63, -(2**63) - 1, 10**30])
def test_a_sequence_id_past_64_bits_names_seq_id(seq_id):
    pool = Pool("row_space")
    before = state(pool.mgr)
    with pytest.raises(ValueError, match=r"^seq_id values must be in \[-9223372036854775808, 9223372036854775807\], "
                                         rf"got {seq_id}"):
        pool.mgr.allocate(seq_id, [1, 2, 3])
    with pytest.raises(ValueError, match="^seq_ids values must be in"):
        pool.mgr.deallocate([seq_id])
    assert state(pool.mgr) == before


@pytest.mark.parametrize("call", ["allocate", "can_allocate", "ensure_for_tokens", "commit_decode"])
def test_float_ids_counts_and_tokens_are_refused_not_truncated(call):
    pool = Pool("row_space")
    prefilled(pool, 1, 300)
    pool.mgr.allocate(2, list(range(200)))
    before = state(pool.mgr)
    with pytest.raises(TypeError, match=r"^(tokens|counts|seq_ids) must hold ints, got float"):
        if call == "allocate":
            pool.mgr.allocate(3, [1.5, 2.0, 3.0])
        elif call == "can_allocate":
            pool.mgr.can_allocate([1.0] * 10)
        elif call == "ensure_for_tokens":
            pool.mgr.ensure_for_tokens([2], [100.7])
        else:
            pool.mgr.append([1], 1)
            before = state(pool.mgr)
            pool.mgr.commit_decode([1.0], [1], [5])
    assert state(pool.mgr) == before


def test_commit_decode_without_append_says_to_call_append():
    """Was: "counts must be in [1, 0]"."""
    pool = Pool("static")
    prefilled(pool, 1, 300)
    before = state(pool.mgr)
    with pytest.raises(ValueError, match=r"^commit_decode: sequence 1 has no positions scheduled: call append\(\) "
                                         r"before the step's forward"):
        pool.mgr.commit_decode([1], [1], [5])
    assert state(pool.mgr) == before


@pytest.mark.parametrize("tokens, exc, fragment", [
    ([1.0] * 128, TypeError, r"^tokens must hold ints, got float 1\.0"),
    ([True] * 128, TypeError, r"^tokens must hold ints, got bool"),
    (["7"] * 128, TypeError, r"^tokens must hold ints, got str"),
    ([2**40] * 128, ValueError, r"^tokens values must be in \[0, 2147483647\], got 1099511627776")])
def test_block_hashes_of_bad_tokens_name_tokens(tokens, exc, fragment):
    with pytest.raises(exc, match=fragment):
        ukv_torch.block_hashes(tokens, 128)


@pytest.mark.parametrize("hashes, exc, fragment", [
    ([2**64 + 5], ValueError, r"^block_hashes values must be in \[0, 18446744073709551615\], got 18446744073709551621"),
    ([-5], ValueError, r"^block_hashes values must be in \[0, 18446744073709551615\], got -5"),
    ([1.5], TypeError, r"^block_hashes must hold ints, got float")])
def test_swa_page_hashes_of_values_past_64_bits_are_refused(hashes, exc, fragment):
    """2^64 + 5 was read as 5."""
    with pytest.raises(exc, match=fragment):
        ukv_torch.swa_page_hashes(hashes, 4)


@pytest.mark.parametrize("bad, exc, fragment", [
    (1.0, TypeError, r"^tokens must hold ints, got float 1\.0"),
    (True, TypeError, r"^tokens must hold ints, got bool"),
    (2**64, ValueError, r"^tokens values must be in \[-9223372036854775808, 9223372036854775807\], got 18446744073709551616"),
    (-(2**63) - 1, ValueError, r"^tokens values must be in \[-9223372036854775808, 9223372036854775807\]")])
def test_one_bad_value_in_a_long_prompt_list_is_named(bad, exc, fragment):
    """A prompt list is converted at C speed: one bad value among 100K is still refused by name, nothing admitted."""
    pool = Pool("row_space")
    before = state(pool.mgr)
    tokens = list(range(100_000))
    tokens[77_777] = bad
    with pytest.raises(exc, match=fragment):
        pool.mgr.allocate(1, tokens)
    assert state(pool.mgr) == before


def test_a_long_prompt_list_converts_exactly():
    from ukv_torch.manager.kv_manager import token_tensor
    tokens = [0, 2**63 - 1, -(2**63), 5] + list(range(100_000))
    assert token_tensor(tokens).tolist() == tokens and token_tensor(tokens).dtype == torch.int64
