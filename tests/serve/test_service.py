"""The served Service's defaults: what it encodes prompts with follows what its scheduler decodes with."""

from met.engine.policy_base import PlainPolicy
from met.engine.runner import ModelRunner
from met.engine.scheduler import Scheduler
from met.model.tokenizer import BYTES, ByteTokenizer
from met.serve.app import Service


def test_a_service_encodes_with_its_schedulers_tokenizer_unless_told(model):
    # a Service over a scheduler of another tokenizer once encoded prompts as bytes and decoded with the other
    other = ByteTokenizer()
    scheduler = Scheduler(ModelRunner(model, 1), PlainPolicy(), "m@test", tokenizer=other)
    assert Service(scheduler, ("m",)).tokenizer is other
    assert Service(scheduler, ("m",), tokenizer=BYTES).tokenizer is BYTES
