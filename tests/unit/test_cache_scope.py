"""Whose cached features a segment may use: its own API key's, unless the operator shares the
cache (VOXFARM_SHARE_FEATURE_CACHE); the end-to-end proof is tests/e2e/test_auth.py."""

from __future__ import annotations

from app.broker.messages import BookOwner, JobOwner, Segment
from app.farm import Farm
from app.settings import Settings
from app.stores.features import cache_owner, mel_cache_key, noise_seed, scoped_key
from tests.helpers import with_db

JOB = dict(voice="en-us", speed=1.0, fmt="wav", chars=10, sample_rate=22050)


def of_job(job_id: str) -> Segment:
    return Segment(JobOwner(job_id), 0, "maɪ", "en-us", 1.0, 0)


def of_book(book_id: str) -> Segment:
    return Segment(BookOwner(book_id, 0, 0), 0, "maɪ", "en-us", 1.0, 0)


def farm_on(redis_url: str, prefix: str, **settings) -> Farm:
    return Farm(Settings().with_(redis_url=with_db(redis_url, 4), key_prefix=prefix,
                                 **settings))


def test_a_keys_segments_share_features_only_with_that_key(redis_url):
    farm = farm_on(redis_url, "cs1")
    alice = farm.jobs.create(owner="aaaa1111", **JOB)["id"]
    alice_again = farm.jobs.create(owner="aaaa1111", **JOB)["id"]
    bob = farm.jobs.create(owner="bbbb2222", **JOB)["id"]
    opened = farm.jobs.create(**JOB)["id"]  # made while the farm had no keys
    content = mel_cache_key("espeak", "maɪ bˈæŋk pˈɪn", "en-us", 1.0)

    def key_of(spec: Segment) -> str:
        return scoped_key(content, cache_owner(farm, spec))

    assert key_of(of_job(alice)) == key_of(of_job(alice_again))
    assert key_of(of_job(alice)) != key_of(of_job(bob))
    assert key_of(of_job(opened)) == content  # no owner: the farm-wide entry
    assert key_of(of_job("gone")) not in (content, key_of(of_job(alice)))
    farm.books.create("book1", title="t", author="a", voice="en-us", speed=1.0,
                      formats=("mp3",), chapters=1, words=3, sample_rate=22050,
                      source_format="txt", owner="aaaa1111")
    assert key_of(of_book("book1")) == key_of(of_job(alice))
    # The noise seed comes from the content alone: the same request, the same audio.
    assert noise_seed(content) == noise_seed(mel_cache_key("espeak", "maɪ bˈæŋk pˈɪn",
                                                           "en-us", 1.0))


def test_an_operator_may_share_the_cache_across_keys(redis_url, monkeypatch):
    monkeypatch.setenv("VOXFARM_SHARE_FEATURE_CACHE", "true")
    settings = Settings.from_env()
    assert settings.share_feature_cache is True
    farm = farm_on(redis_url, "cs2", share_feature_cache=settings.share_feature_cache)
    alice = farm.jobs.create(owner="aaaa1111", **JOB)["id"]
    bob = farm.jobs.create(owner="bbbb2222", **JOB)["id"]
    assert cache_owner(farm, of_job(alice)) == cache_owner(farm, of_job(bob)) == ""
