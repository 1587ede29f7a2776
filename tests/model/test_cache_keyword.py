"""The KV-cache keyword follows the model's own ``forward`` signature (transformers 5.24 rename)."""

from types import SimpleNamespace

from entmtp.model._cache_keyword import cache_keyword, returned_cache


class NewStyle:
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return cache


class OldStyle:
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
        return past_key_values


def test_cache_keyword_reads_the_forward_signature():
    assert cache_keyword(NewStyle()) == "cache"
    assert cache_keyword(OldStyle()) == "past_key_values"


def test_returned_cache_reads_either_output_field():
    marker = object()
    assert returned_cache(SimpleNamespace(cache=marker)) is marker
    assert returned_cache(SimpleNamespace(past_key_values=marker)) is marker
    assert returned_cache(SimpleNamespace(cache=None, past_key_values=marker)) is marker
    assert returned_cache(SimpleNamespace()) is None
