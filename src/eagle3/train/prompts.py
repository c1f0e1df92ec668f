"""Chat prompts to distil the target's answers from.

- :func:`default_prompts`: what ``train_head`` uses when given none: every
  instruction below applied to every subject. Held-out prompts for measuring
  a head come from :func:`eagle3.shipped.held_out_chat_prompts`, which shares
  none of these instruction templates or subjects.
- :func:`self_prompts`: prompts the target writes itself, in the style of
  the chats it was tuned on (a fixed template set teaches a head that style
  only).
"""

from __future__ import annotations

import os

from eagle3._validate import as_int
from eagle3.errors import InvalidArgumentError
from eagle3.train.progress import Progress

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


_MARK = "[eagle3: the user turn starts here]"  # (a C string: no NUL)


def self_prompts(target: str | os.PathLike, n: int, *, seed: int = 0, max_tokens: int = 128,
                 temperature: float = 1.0, n_seq: int = 8, threads: int | None = None,
                 progress: bool = True) -> list[str]:
    """``n`` chat prompts written by the chat model ``target`` itself.

    The target's chat template is rendered up to where a user's turn begins
    (its system message included, when the template writes one), and the
    target continues from there, sampled at ``temperature``: an instruction
    tuned model writes the kind of request it was tuned to answer. Only turns
    the model ends itself (an end-of-generation token within ``max_tokens``)
    are kept, stripped, and each text once. Stops after ``4 * n`` tries, so
    fewer than ``n`` may come back from a model that rarely ends a turn.
    ``seed`` fixes every draw.
    """
    from eagle3.context import Context, default_threads
    from eagle3.model import Model

    n, max_tokens, n_seq = (as_int(v, name, 1) for v, name in ((n, "n"), (max_tokens, "max_tokens"), (n_seq, "n_seq")))
    with Model(target) as model:
        if model.chat_template is None:
            raise InvalidArgumentError(f"{model.path} has no chat template: it cannot write its own chat prompts")
        text = model.apply_chat_template([{"role": "user", "content": _MARK}], add_generation_prompt=False)
        if _MARK not in text:
            raise InvalidArgumentError(f"{model.path}'s chat template does not write the user's message")
        prefix = model.template_tokens(text[:text.index(_MARK)])
        out: list[str] = []
        seen: set[str] = set()
        bar = Progress("prompts", n, progress)
        with Context(model, n_ctx=n_seq * (len(prefix) + max_tokens + 1), n_seq_max=n_seq,
                     n_threads=threads or default_threads()) as ctx:
            for attempt in range(0, 4 * n, n_seq):
                gens = ctx.generate_batch([prefix] * n_seq, max_tokens, temperature=temperature, seed=seed + attempt)
                for g in gens:
                    turn = g.text.strip()
                    if (g.finish_reason == "stop" and turn and turn.casefold() not in seen
                            and not any(model.is_eog(t) for t in g.tokens[:-1])):
                        seen.add(turn.casefold())
                        out.append(turn)
                        bar.advance(1)
                if len(out) >= n:
                    break
        bar.done()
    return out[:n]
