"""The registry of the wire formats the simulator speaks: simulator/wire.py holds the base and
the Chat Completions and Messages dialects, the newer ones have a module each."""

from __future__ import annotations

from simulator.bedrock import BedrockConverse
from simulator.gemini import GeminiNative
from simulator.responses import OpenAIResponses
from simulator.wire import AnthropicMessages, AzureChat, OpenAIChat, WireFormat

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
