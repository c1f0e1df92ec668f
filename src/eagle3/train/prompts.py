"""The chat prompts ``train_head`` distils the target's answers from when none
are given: every instruction below applied to every subject. They are written
here; held-out prompts for measuring a head come from
:func:`eagle3.shipped.held_out_chat_prompts`, which shares none of these
instruction templates or subjects.
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
    # history and people
    "the Industrial Revolution", "ancient Egypt", "the Silk Road", "the Cold War", "the Vikings", "the Space Race",
    "Leonardo da Vinci", "Marie Curie", "Isaac Newton", "Charles Darwin", "the ancient Greeks", "the Aztecs",
    # life and health
    "evolution", "DNA", "bacteria", "the human brain", "memory", "nutrition", "vitamins", "yoga", "meditation",
    "the digestive system", "allergies", "drinking enough water", "first aid",
    # space and physics
    "comets", "the Sun", "galaxies", "the Big Bang", "Mars", "telescopes", "satellites", "rockets", "magnets",
    "light", "sound waves", "atoms", "chemical reactions", "nuclear power", "wind turbines", "batteries",
    # the Earth and living things
    "glaciers", "deserts", "rainforests", "coral reefs", "rivers", "hurricanes", "lightning", "clouds", "soil",
    "wolves", "elephants", "whales", "penguins", "octopuses", "ants", "bird migration", "sharks", "mushrooms",
    "pollination", "endangered species", "national parks", "composting", "air pollution",
    # technology
    "smartphones", "social media", "video games", "artificial intelligence", "robots", "3D printing",
    "cloud computing", "strong passwords", "learning to program in Python", "databases", "GPS", "email etiquette",
    # numbers and money
    "prime numbers", "probability", "fractions", "statistics", "budgeting", "credit cards", "taxes",
    "supply and demand", "starting a small business", "marketing",
    # work, people and culture
    "teamwork", "leadership", "job interviews", "volunteering", "reading books", "writing essays", "painting",
    "photography", "classical music", "theater", "movies", "poetry", "soccer", "basketball", "swimming", "hiking",
    "traveling abroad", "museums", "tea", "chocolate", "cheese", "spices", "cooking pasta", "bridges",
    "skyscrapers", "trains", "bicycles", "kindness", "creativity", "happiness", "patience",
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
    "List five practical tips related to {}.",
    "Write a short dialogue between two friends talking about {}.",
    "Write a very short tale that involves {}.",
    "Compare {} with something from everyday life.",
    "What questions do people often ask about {}, and what are the answers?",
    "Create a short quiz with three questions about {}, with the answers.",
    "Write an encouraging message to someone who wants to learn about {}.",
    "Describe {} in five bullet points.",
    "What would the world be like without {}?",
    "Outline a beginner's step-by-step plan for getting into {}.",
    "Write a short email to a coworker about {}.",
    "Which words should I know when talking about {}? Define each one.",
)


def default_prompts() -> list[str]:
    """Each instruction with each subject, interleaved so that any first few
    hundred cover every subject and every instruction: round r gives subject
    s instruction (s + r) mod the number of instructions."""
    n = len(_INSTRUCTIONS)
    return [_INSTRUCTIONS[(s + r) % n].format(subject) for r in range(n) for s, subject in enumerate(_SUBJECTS)]
