"""The embedded default policy, ``--model tiny``: a few-million-parameter Qwen3 model.

It is built locally from a config and a fixed seed (random weights) with a byte-level
BPE tokenizer trained on the built-in environments' texts, so the whole pipeline
(rollouts, HP-RLVR, GRPO) runs end to end on a CPU-only machine without a model hub.
The folder it writes loads like any hub model with ``AutoTokenizer.from_pretrained``
and ``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from importlib import import_module
from itertools import islice
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from hp_agent.envs.base import TextEnv
from hp_agent.paths import cache_root

# Bump whenever the recipe changes (the corpus, including CORPUS_ENVS' texts, the
# tokenizer, config or init): cached folders are keyed by it, so a new version rebuilds
# instead of reusing a stale model.
TINY_VERSION = "tiny-qwen3-v2"

# Embedded model variants: name -> (cache folder, "module:function" yielding extra corpus
# texts, or None). ``tiny-alfworld``'s tokenizer also holds every ALFRED object and
# receptacle name as one token (see docs/results.md for what that did).
TINY_VARIANTS: dict[str, tuple[str, str | None]] = {
    "tiny": (TINY_VERSION, None),
    "tiny-alfworld": ("tiny-alfworld-qwen3-v1", "hp_agent.envs.alfworld.env:vocabulary_texts"),
}

# Built-in env classes whose texts train the tokenizer. Plugins are left out on purpose:
# the tiny model must be the same on every machine. Append ALFWorld/code envs here.
CORPUS_ENVS: tuple[str, ...] = ("hp_agent.envs.math:MathEnv", "hp_agent.envs.alfworld.env:AlfworldEnv")

# Caps the texts taken from each env so that a large dataset keeps the build fast.
MAX_TEXTS_PER_ENV = 20_000

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK_START, THINK_END = "<think>", "</think>"
# BPE stops short of this when the corpus runs out of pairs to merge.
MAX_VOCAB_SIZE = 4096
# The embedding is the tokenizer's size rounded up to this, as Qwen pads its vocab; a
# tight fit matters because a random model samples all ids alike, and ids past the
# tokenizer decode to nothing.
VOCAB_MULTIPLE = 64

# Qwen2/Qwen3's pre-tokenizer split: digits one at a time (good for arithmetic), words
# with their leading space, punctuation runs, and newlines kept apart from other text.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's ChatML template, reduced to plain-text messages. With enable_thinking=False the
# generation prompt closes an empty think block, as Qwen3 does to switch thinking off.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Generic chat, household and code text so that text outside the envs' corpora still
# tokenizes into sensible pieces rather than single bytes.
GENERIC_TEXT = r"""
You are a helpful assistant. Answer the question as well as you can.
People often ask how a machine can learn from experience. The idea is simple: an agent
tries something, sees what happens, and changes its behavior so that good outcomes become
more likely. A reward tells the agent how well it did, but only at the end, so it has to
work out which of its earlier choices deserve the credit and which deserve the blame.

Language models are trained first to predict the next word in a very large collection of
documents, and later to follow instructions, to hold a conversation and to solve problems.
During training the model generates an answer, a verifier checks whether the answer is
correct, and the learning algorithm updates the model's parameters in the right direction.
The policy is the model itself; a rollout is one complete attempt; an episode ends when the
task is solved, when the agent gives up, or when it runs out of turns or tokens.

It is important to keep the experiments small, reproducible and easy to understand. Write
down every setting, use a fixed random seed, save checkpoints often, and compare results
against a simple baseline before you believe that a new method really works better.
When something goes wrong, read the error message carefully, reproduce the problem with
the smallest possible example, form a hypothesis, change one thing at a time, and test
again. Most bugs are found this way, and the fix is usually much shorter than the search.
Good writing is clear and direct. Use short sentences and common words. Say what you mean,
give an example when it helps, and remove anything that does not help the reader.

Yesterday we visited my grandmother, who lives in a small house near the river. She made
soup, bread and a chocolate cake, and after dinner we played cards until it was dark.
The children went to school by bus, while their parents drove to work in the city center.
Please open the window, turn off the light, close the door and put the keys on the table.
Could you check whether the store is open on Sunday? I need milk, eggs, rice and coffee.
The company announced that its new product will be available next year in several countries.
Scientists believe that the climate is changing faster than expected because of human activity.
Water boils at 100 degrees Celsius at sea level and freezes at 0 degrees.
The train leaves at 8:15 and arrives at 11:40, so the trip takes three hours and 25 minutes.
A rectangle has four right angles; its area is the length times the width, and its perimeter
is twice the sum of the length and the width. A circle's area is pi times the radius squared.
If a shirt costs 20 dollars and is on sale for 25 percent off, the new price is 15 dollars.
Alice is older than Bob, and Bob is older than Carol, so Alice is older than Carol.
The probability of rolling a six with a fair die is one in six, and of two sixes in a row,
one in thirty-six. The expected value of a single roll is 3.5.

To make a cup of tea, boil the water, put the tea bag in the cup, pour the water, wait three
minutes, remove the bag and add milk or sugar if you like.
First, wash the vegetables. Next, cut them into small pieces. Then cook them in a pan with
a little oil for ten minutes, stirring from time to time. Finally, add salt and serve hot.
Clean the dishes in the sink, dry them with a towel and put them back in the cupboard.
The cat is sleeping on the sofa, the dog is playing in the garden, and the bird is singing.
Find the book on the shelf, take it to the desk, turn on the lamp and read the first chapter.
He picked up the phone, checked the time, and put it down next to the alarm clock.
She looked under the bed, inside the drawer and behind the door, but the key was not there.
I think the best approach is to break the problem into smaller parts and solve each one.
Is there anything else I can help you with? Let me know if you have more questions.
Here is a possible solution. It is not the only one, but it is simple and easy to check.
Note that this function has no side effects: it only reads its arguments and returns a value.
The function returns a new list and leaves the input unchanged. It raises a ValueError if
the input is empty, and a TypeError if an element is not a number.
Run the tests before and after every change. If a test fails, fix the code, not the test.
Use version control: commit small changes with clear messages, and review the diff first.
The server returned status code 404 because the requested page was not found.
Install the package, import the module, create an object, call the method, print the result.
Please think step by step, then give your final answer on the last line.
Let's think about this carefully. First, we read the problem. Then we plan a solution.
Sure! Here is a short summary of the main points, followed by an example.
I'm sorry, but I don't have enough information to answer that. Could you tell me more?
Thank you for your question. The short answer is yes; the long answer depends on the details.
Can you help me write an email to my team about the meeting next Monday at 10 a.m.?
What is the capital of France? The capital of France is Paris.
Explain the difference between a list and a tuple in Python.
Translate the following sentence into English: "Je voudrais un café, s'il vous plaît."
Summarize the following text in two sentences. Do not add any new information.
Write a story about a cat who learns to play the piano. Keep it under 200 words.
The weather today is sunny with a few clouds; tomorrow it will rain in the afternoon.
In the morning she walked to the station, bought a ticket and waited for the train.
The results show that the new method is faster, cheaper and more accurate than the old one.
However, there are some limitations: the data set is small and the labels are noisy.
Therefore, the answer is 42. In conclusion, both approaches work, but the second is simpler.
Wait, that doesn't look right. Let me check the calculation again.
Hmm, so the total is the sum of the two parts. Let me verify: 3 + 4 = 7, and 7 * 6 = 42.
Okay, so we need to find the value of x such that 2x + 3 = 11. Subtracting 3 gives 2x = 8, so x = 4.
Step 1: Understand the goal. Step 2: Make a plan. Step 3: Carry it out. Step 4: Look back.
The user asked for a list of three items. Here they are: apples, bread and milk.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 15 20 25 50 100 1000 2024 3.14 -1 1/2 0.5 1e-3 99%
Dates and times: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday; 9:30 am.
Months: January, February, March, April, May, June, July, August, September, October, November, December.
Colors: red, orange, yellow, green, blue, purple, black, white, brown, gray, pink.
Punctuation and symbols: . , ; : ! ? ' " ( ) [ ] { } < > / \ | - _ + = * & ^ % $ # @ ~ `
Unicode: café, naïve, Zürich, São Paulo, Ελληνικά, русский, 中文, 日本語, 한국어, emoji 🙂 ✓ → ≤ ≥ ≠ ∞ π ∑ √ ×
You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a cabinet 2,
a countertop 1, a drawer 1, a drawer 2, a fridge 1, a garbagecan 1, a microwave 1, a shelf 1,
a sinkbasin 1, a stoveburner 1, a toaster 1, a coffeemachine 1, a diningtable 1, and a sofa 1.
Your task is to: put a clean apple in the fridge.
Your task is to: heat some egg and put it in the countertop.
Your task is to: cool a mug and put it in the cabinet.
Your task is to: look at the book under the desklamp.
Your task is to: find two pillows and put them in the sofa.
> go to countertop 1
On the countertop 1, you see a knife 1, a lettuce 2, a plate 1, and a saltshaker 1.
> take knife 1 from countertop 1
You pick up the knife 1 from the countertop 1.
> open fridge 1
You open the fridge 1. The fridge 1 is open. In it, you see a tomato 1, and a potato 2.
> clean apple 1 with sinkbasin 1
You clean the apple 1 using the sinkbasin 1.
> heat egg 1 with microwave 1
You heat the egg 1 using the microwave 1.
> cool mug 1 with fridge 1
> put apple 1 in/on fridge 1
You put the apple 1 in/on the fridge 1.
> use desklamp 1
You turn on the desklamp 1.
> inventory
You are carrying: a cellphone 1.
> look
Nothing happens. Admissible actions: go to bed 1, examine drawer 3, close drawer 3, think.
The kitchen has a sink, a stove, an oven, a table and four chairs. The bedroom has a bed,
a dresser, a lamp and a window. The bathroom has a towel, a toilet, a bathtub and a mirror.
Objects: apple, bread, bowl, butterknife, candle, cloth, creditcard, cup, dishsponge, egg,
fork, glassbottle, houseplant, kettle, keychain, ladle, laptop, newspaper, pan, pen, pencil,
peppershaker, pillow, pot, remotecontrol, soapbar, spatula, spoon, spraybottle, statue,
tissuebox, toiletpaper, vase, watch, winebottle, alarmclock, basketball, cd, box.
```python
import math
from collections import defaultdict


def solve(numbers: list[int], target: int) -> list[int] | None:
    '''Return the indices of two numbers that add up to target, or None.'''
    seen: dict[int, int] = {}
    for index, value in enumerate(numbers):
        if target - value in seen:
            return [seen[target - value], index]
        seen[value] = index
    return None


class Counter:
    def __init__(self) -> None:
        self.counts = defaultdict(int)

    def add(self, key: str) -> None:
        self.counts[key] += 1


if __name__ == "__main__":
    print(solve([2, 7, 11, 15], 9))
    assert math.isclose(math.sqrt(2) ** 2, 2.0)
```
def test_solve():
    assert solve([3, 2, 4], 6) == [1, 2]
    with pytest.raises(ValueError):
        int("not a number")
for i in range(n):
    while x > 0 and not done:
        x, y = y % x, x
try:
    value = json.loads(line)
except (KeyError, IndexError) as error:
    raise RuntimeError(f"bad input: {error}") from error
else:
    return sorted(items, key=lambda item: item[1], reverse=True)
Traceback (most recent call last):
  File "main.py", line 3, in <module>
TypeError: unsupported operand type(s) for +: 'int' and 'str'
$ python -m pytest -q tests/
{"name": "example", "values": [1, 2, 3], "nested": {"ok": true, "error": null}}
int main(void) { printf("hello, world\n"); return 0; }
function add(a, b) { return a + b; } const result = add(1, 2); console.log(result);
SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY name;
# Heading
- bullet point one
- bullet point two
1. first item
2. second item
**bold** and *italic* and `inline code` and [a link](https://example.com).
| column | value |
|--------|-------|
| a      | 1     |
"""


def _env_texts(spec: str) -> Iterator[str]:
    """The system prompt and corpus texts of env class ``spec`` (``"module:Class"``)."""
    module_name, _, attr = spec.partition(":")
    env_class: type[TextEnv] = getattr(import_module(module_name), attr)
    if env_class.system_prompt:
        yield env_class.system_prompt
    yield from islice(env_class.corpus_texts(), MAX_TEXTS_PER_ENV)


def corpus(extra: str | None = None) -> Iterator[str]:
    """The tokenizer's training texts, in a fixed order: env texts, the ``extra`` texts
    (``"module:function"``), then generic text."""
    for spec in CORPUS_ENVS:
        yield from _env_texts(spec)
    if extra is not None:
        module_name, _, attr = extra.partition(":")
        yield from getattr(import_module(module_name), attr)()
    yield GENERIC_TEXT


def train_tokenizer(extra: str | None = None) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on :func:`corpus` and wrap it for transformers."""
    tokenizer = Tokenizer(models.BPE())
    # No normalizer: decode(encode(text)) must give back exactly the text, any unicode.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # <think> tags are ordinary added tokens as in Qwen3 (special=False), so they stay in
    # text decoded with skip_special_tokens=True; two ids are kept free for them.
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB_SIZE - 2,
        min_frequency=2,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(extra), trainer=trainer)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in (THINK_START, THINK_END)])
    # bos is declared (Qwen3's config names <|endoftext|> as bos) but, as in Qwen3,
    # never prepended: the post-processor adds no tokens.
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_config(tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    """The model's config, with special-token ids taken from ``tokenizer``."""
    return Qwen3Config(
        vocab_size=-(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        max_window_layers=4,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 model; the same ``seed`` gives the same weights."""
    config = tiny_config(tokenizer)
    # fork_rng: seeding must not disturb the caller's global torch RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # float32 whatever torch's default dtype: the CPU path trains in full precision.
        model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def build_tiny_model(out_dir: Path, seed: int = 0, extra_corpus: str | None = None) -> Path:
    """Train the tokenizer, build the model and save both into ``out_dir``.

    The folder appears atomically: everything is written into a temporary sibling that
    is then renamed, so readers never see a half-written model. If another builder
    finished ``out_dir`` first, its result is kept and this build is discarded.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tokenizer = train_tokenizer(extra_corpus)
        build_model(tokenizer, seed).save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        # mkdtemp (and safetensors) write private modes; a shared cache must be readable.
        for path in (tmp_dir, *tmp_dir.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            # rename(2) replaces an empty directory but refuses a non-empty one.
            tmp_dir.rename(out_dir)
        except OSError as error:
            if not (out_dir / "config.json").is_file():
                raise FileExistsError(f"{out_dir} exists and holds no model; remove it or pick another folder") from error
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir


def tiny_model_path(variant: str = "tiny") -> Path:
    """The cached folder of a :data:`TINY_VARIANTS` model, built on first use (a few seconds)."""
    folder, extra_corpus = TINY_VARIANTS[variant]
    path = cache_root() / folder
    if (path / "config.json").is_file():
        return path
    return build_tiny_model(path, extra_corpus=extra_corpus)
