"""The registry of the wire formats the simulator speaks: simulator/wire.py holds the base, and
each dialect has a module of its own."""

from __future__ import annotations

from simulator.azure import AzureChat
from simulator.bedrock import BedrockConverse
from simulator.chat import OpenAIChat
from simulator.gemini import GeminiNative
from simulator.messages import AnthropicMessages
from simulator.responses import OpenAIResponses
from simulator.wire import WireFormat

FORMATS: dict[str, WireFormat] = {
    f.name: f
    for f in (
        OpenAIChat(),
        AzureChat(),
        AnthropicMessages(),
        OpenAIResponses(),
        GeminiNative(),
        BedrockConverse(),
    )
}
