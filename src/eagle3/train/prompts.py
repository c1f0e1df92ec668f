"""The chat prompts ``train_head`` distils the target's answers from when none
are given: every instruction below applied to every subject, in a fixed
order. They are written here; held-out prompts for measuring a head come
from :func:`eagle3.shipped.held_out_chat_prompts`, which shares none of
these instructions or subjects.
"""

from __future__ import annotations

_SUBJECTS = (
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "the French Revolution", "the Roman Empire",
    "machine learning", "compound interest", "the immune system", "climate change", "the printing press",
    "electric cars", "coffee", "the Moon landing", "honeybees", "the stock market", "recycling", "earthquakes",
    "the human heart", "solar panels", "the internet", "vaccines", "chess", "the Great Wall of China", "rainbows",
    "gravity", "the Olympic Games", "dinosaurs", "sleep", "the ocean tides", "bread baking", "jazz music",
    "the Pythagorean theorem", "democracy", "plate tectonics", "antibiotics", "renewable energy", "the Renaissance",
    "friendship", "time management", "public speaking", "learning a new language", "gardening", "running a marathon",
    "saving money", "cats", "the moon's phases", "electricity", "the periodic table", "spiders",
)

_INSTRUCTIONS = (
    "Explain {} in simple terms.",
    "What are three interesting facts about {}?",
    "Write a short paragraph about {} for a school newsletter.",
    "Why is {} important?",
    "Give me a brief history of {}.",
    "What are the main advantages and disadvantages of {}?",
    "Write a four-line poem about {}.",
    "How would you explain {} to a ten-year-old?",
    "Summarize the key ideas of {} in a few sentences.",
    "What is a common misconception about {}?",
)


def default_prompts() -> list[str]:
    """Each instruction with each subject: 500 user messages."""
    return [instruction.format(subject) for subject in _SUBJECTS for instruction in _INSTRUCTIONS]
