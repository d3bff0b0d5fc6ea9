"""The tests' name for :class:`threads_celery.provider_emulator.ProviderEmulator`."""

from threads_celery.provider_emulator import BilledRequest, ProviderEmulator, Reply, Script, split_fragments

FakeOpenAI = ProviderEmulator

__all__ = ["BilledRequest", "FakeOpenAI", "ProviderEmulator", "Reply", "Script", "split_fragments"]
