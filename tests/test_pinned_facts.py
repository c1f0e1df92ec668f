"""Facts about the pinned llama.cpp that eagle3 states as literals (lists, tables, numbers),
derived again from its source (the tree the build used, ``_build_config.LLAMA_CPP_SOURCE``).

When the pin moves, these say which literal to update. Each test names where eagle3 keeps
the fact and where llama.cpp does. Facts that are not derived again, and why, are listed
at the end of this file.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3 import _build_config, _core, _logging, compat, remote

# (the package's quantize and convert are functions; these are their modules)
quantize = importlib.import_module("eagle3.quantize")
convert = importlib.import_module("eagle3.convert")

ROOT = Path(_build_config.LLAMA_CPP_SOURCE)
SRC = ROOT / "src"
REPO = Path(__file__).resolve().parent.parent
SHIM = REPO / "src" / "eagle3" / "shim" / "eagle3_shim.cpp"
pytestmark = pytest.mark.skipif(not (SRC / "models").is_dir(), reason="the pinned llama.cpp source is not here")
needs_repo = pytest.mark.skipif(not SHIM.exists(), reason="needs eagle3's source tree")


def _read(rel: str) -> str:
    return (ROOT / rel).read_text()


def _uncommented(text: str) -> str:
    """C/C++ source without its // and /* */ comments (string literals are kept as they are)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


@functools.lru_cache(maxsize=None)
def _arch_names() -> dict[str, str]:
    """LLM_ARCH_* -> the architecture's name (llama-arch.cpp)."""
    return dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', _read("src/llama-arch.cpp")))


@functools.lru_cache(maxsize=None)
def _graph_sources() -> dict[str, str]:
    """Architecture name -> the source (comments removed) of the src/models/*.cpp files that
    define its model class (llama-model.cpp maps each LLM_ARCH_* to a class)."""
    class_of, pending = {}, []
    for line in _read("src/llama-model.cpp").splitlines():
        if m := re.search(r"case (LLM_ARCH_\w+):", line):
            pending.append(m.group(1))
        elif m := re.search(r"return new (llama_model_\w+)\(", line):
            class_of.update(dict.fromkeys(pending, m.group(1)))
            pending = []
        elif re.match(r"\s*(break;|default:)", line):
            pending = []
    texts: dict[str, list[str]] = {}
    for path in sorted((SRC / "models").glob("*.cpp")):
        text = _uncommented(path.read_text())
        for cls in set(re.findall(r"(llama_model_\w+)::", text)):
            texts.setdefault(cls, []).append(text)
    names = _arch_names()
    return {names[arch]: "\n".join(texts.get(cls, [])) for arch, cls in class_of.items() if arch in names}


def _graph_part(text: str) -> str:
    """From a model file's first graph constructor on (what builds the compute graph)."""
    m = re.search(r"::graph(<[^>]*>)?::graph\(", text)
    return text[m.start():] if m else ""


def _archs_where(predicate) -> set[str]:
    return {arch for arch, text in _graph_sources().items() if predicate(text)}


def _archs_whose_graph_asserts(asserts: str) -> set[str]:
    """Architectures whose model file has a line ``GGML_ASSERT(<asserts>)`` (a regular expression)."""
    return _archs_where(lambda text: re.search(rf"^\s*GGML_ASSERT\({asserts}\)", text, re.M))


def _archs_of_function(function: str) -> set[str]:
    """The architectures a ``bool function(const llm_arch & arch)`` of llama-arch.cpp lists as cases."""
    m = re.search(rf"bool {function}\(const llm_arch & arch\) \{{(.*?)\n\}}", _read("src/llama-arch.cpp"), re.S)
    assert m, function
    return {_arch_names()[a] for a in re.findall(r"case (LLM_ARCH_\w+):", m.group(1))}


def _enum(text: str, name: str) -> dict[str, int]:
    """The members of C enum ``name`` in ``text`` and their values."""
    m = re.search(rf"enum {name}\s*\{{(.*?)\}};", _uncommented(text), re.S)
    assert m, name
    members, value = {}, -1
    for entry in (e.strip() for e in m.group(1).split(",")):
        if not entry:
            continue
        key, _, expr = (part.strip() for part in entry.partition("="))
        value = int(expr, 0) if expr else value + 1
        members[key] = value
    return members


def _define(text: str, name: str) -> int:
    m = re.search(rf"#define {name}\s+(\d+)", text)
    assert m, name
    return int(m.group(1))


def _load_build_support():
    spec = importlib.util.spec_from_file_location("eagle3_build_llama_cpp_facts", REPO / "build_support" /
                                                  "llama_cpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scope() -> set[str]:
    """The architectures eagle3 drafts for, and its own: compat's lists speak of these."""
    return {a for a in _arch_names().values() if _core.eagle3_target_support(a) > 0} | {"eagle3"}


# ---------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------

def test_the_architectures_eagle3_can_draft_for():
    # e3_eagle3_target_support (eagle3_shim.cpp): attention-only graphs that record each
    # layer's input (res->t_layer_inp); 2 where they also record the final pre-norm state
    # (res->t_h_nextn), which common/speculative reads for a target layer id of n_layer.
    recurrent = _archs_of_function("llm_arch_is_recurrent") | _archs_of_function("llm_arch_is_hybrid")
    records = _archs_where(lambda text: "res->t_layer_inp[" in text) - recurrent
    final = _archs_where(lambda text: re.search(r"res->t_h_nextn\s*=", text))
    expected = {arch: 2 if arch in final else 1 for arch in records}
    assert {arch: _core.eagle3_target_support(arch) for arch in _arch_names().values()
            if _core.eagle3_target_support(arch)} == expected
    assert _core.eagle3_target_support("no-such-architecture") == 0


def test_the_architectures_whose_rope_must_rotate_whole_heads():
    # compat.ROPE_IS_WHOLE_HEAD: graphs that assert n_rot == n_embd_head
    assert _archs_whose_graph_asserts(r"n_embd_head(_k)? == (hparams\.)?n_rot") == compat.ROPE_IS_WHOLE_HEAD


def test_the_architectures_whose_key_and_value_heads_must_be_one_size():
    # compat._K_IS_V: graphs that assert n_embd_head_k == n_embd_head_v
    found = _archs_whose_graph_asserts(r"n_embd_head == hparams\.n_embd_head_[kv]\(\w*\)")
    assert found & _scope() == compat._K_IS_V


def test_the_architectures_whose_graph_takes_layer_zeros_head_counts():
    # compat._LAYER0_SHAPED: graphs that use llm_graph_context's n_head / n_head_kv (layer 0's)
    # and never a layer's own hparams.n_head(il)
    def layer0(text):
        graph = _graph_part(text)
        return re.search(r"\bn_head(_kv)?\b", graph) and not re.search(r"\bn_head(_kv)?\(\s*\w+\s*\)", graph)

    assert _archs_where(layer0) & _scope() == compat._LAYER0_SHAPED


def test_the_architectures_whose_graph_ropes():
    # compat._ROPE_ARCHS: rope rotates pairs of a head's dimensions (ggml's rope asserts
    # n_dims <= ne0 and n_dims % 2 == 0)
    assert re.search(r"GGML_ASSERT\(n_dims % 2 == 0\)", _read("ggml/src/ggml-cpu/ops.cpp"))
    ropes = _archs_where(lambda text: "ggml_rope" in _graph_part(text))
    assert ropes & _scope() == compat._ROPE_ARCHS & _scope()
    assert compat.ROPE_IS_WHOLE_HEAD <= compat._ROPE_ARCHS


def test_the_architectures_that_always_have_experts():
    # compat._ALWAYS_EXPERTS: the graph takes the expert path on every layer (no dense
    # layer: it never asks whether a layer has ffn_gate_inp) and the loader does not
    # itself refuse a model without experts
    def always(text):
        return ("build_moe_ffn(" in text and not re.search(r"ffn_gate_inp\s*[!=]=\s*nullptr", text)
                and not re.search(r'throw std::runtime_error\("n_expert must be > 0', text))

    assert _archs_where(always) & _scope() == compat._ALWAYS_EXPERTS


# The sliding-window rules (compat._sliding_window, the SWA branch of _head_sizes) know
# gpt-oss's and gemma4's layouts. These architectures have sliding-window layers too and
# are not checked by them yet.
SLIDING_NOT_CHECKED = {"mimo2", "muse-glimmer"}


def test_the_architectures_with_sliding_window_layers():
    # compat._SWA_ARCHS: graphs with an interleaved sliding-window KV cache
    sliding = _archs_where(lambda text: "build_attn_inp_kv_iswa(" in text) & _scope()
    assert sliding - SLIDING_NOT_CHECKED == compat._SWA_ARCHS
    assert SLIDING_NOT_CHECKED <= sliding
    # gpt-oss without a pattern key: every second layer is sliding (compat._sliding_layers)
    assert re.search(r"load_swa_pattern\(ml, 2\)", _graph_sources()["gpt-oss"])


def test_the_architectures_read_as_dense_with_at_most_one_expert():
    # compat._DENSE_WITH_ONE_EXPERT: load_hparams zeroes n_expert <= 1 for these
    text = _read("src/llama-model.cpp")
    m = re.search(r"if \(((?:arch == LLM_ARCH_\w+(?: \|\| )?)+)\) \{\s*if \(hparams\.n_expert <= 1\)", text)
    assert m
    assert {_arch_names()[a] for a in re.findall(r"LLM_ARCH_\w+", m.group(1))} == compat._DENSE_WITH_ONE_EXPERT


# ---------------------------------------------------------------------------
# Names and values in model files
# ---------------------------------------------------------------------------

def test_the_rope_scaling_type_names():
    # compat._ROPE_SCALING_TYPES: LLAMA_ROPE_SCALING_TYPES (llama-model.cpp)
    m = re.search(r"LLAMA_ROPE_SCALING_TYPES = \{(.*?)\};", _read("src/llama-model.cpp"), re.S)
    assert tuple(re.findall(r'"(\w+)"', m.group(1))) == compat._ROPE_SCALING_TYPES


def test_the_expert_gating_functions():
    # compat._GATING_FUNCS: llama_expert_gating_func_type but NONE (llama-hparams.h)
    members = _enum(_read("src/llama-hparams.h"), "llama_expert_gating_func_type")
    assert tuple(sorted(v for k, v in members.items() if not k.endswith("_NONE"))) == compat._GATING_FUNCS


def test_every_gguf_key_compat_reads_is_one_llama_cpp_knows():
    # the keys compat.py (h.key, d.key, t.key: "<arch>.<name>") and model.py read by name
    # are in LLM_KV_NAMES (llama-arch.cpp)
    table = re.search(r"LLM_KV_NAMES = \{(.*?)\n\};", _read("src/llama-arch.cpp"), re.S).group(1)
    known = set(re.findall(r'"([^"]+)"', table))
    source = Path(compat.__file__).read_text() + Path(compat.__file__).with_name("model.py").read_text()
    per_arch = set(re.findall(r'\b[htd]\.key\("([^"]+)"\)', source))
    global_keys = set(re.findall(r'(?:meta|_metadata)\.get\("([a-z_]+\.[a-z_.]+)"\)', source))
    assert len(per_arch) > 20 and {"general.architecture", "tokenizer.ggml.tokens"} <= global_keys
    assert sorted(k for k in per_arch if f"%s.{k}" not in known) == []
    assert sorted(k for k in global_keys if k not in known) == []


def _tensor_names() -> dict[str, str]:
    table = re.search(r"LLM_TENSOR_NAMES = \{(.*?)\n\};", _read("src/llama-arch.cpp"), re.S).group(1)
    return dict(re.findall(r'\{\s*(LLM_TENSOR_\w+),\s*"([^"]+)"\s*\}', table))


def _size(expr: str, sizes: dict[str, int]) -> int:
    """A create_tensor dimension: names and numbers joined by * and / (integer division)."""
    value, op = 1, "*"
    for token in re.findall(r"\w+|[*/]", expr):
        if token in "*/":
            op = token
            continue
        operand = int(token) if token.isdigit() else sizes[token]
        value = value * operand if op == "*" else value // operand
    return value


def test_the_eagle3_draft_tensors_and_their_shapes():
    # compat.draft_tensor_shapes: what llama_model_eagle3::load_arch_tensors creates
    text = _uncommented((SRC / "models" / "eagle3.cpp").read_text())
    body = re.search(r"void llama_model_eagle3::load_arch_tensors\(.*?\n\}", text, re.S).group(0)
    names = _tensor_names()
    # a draft whose every size differs, so that a swapped size shows
    e, f, heads, kv, head, target, vocab, d2t, n_rot = 64, 96, 4, 2, 24, 40, 300, 120, 16
    sizes = {"n_embd": e, "n_ff": f, "n_embd_inp": 3 * target, "n_embd_attn_input": 2 * e, "n_embd_head_k": head,
             "n_head": heads, "n_embd_k_gqa": head * kv, "n_embd_v_gqa": head * kv, "n_draft_vocab": d2t,
             "n_target_vocab": vocab, "n_rot": n_rot}
    derived = {}
    for m in re.finditer(r"create_tensor\(tn\((LLM_TENSOR_\w+)(?:,\s*\"(\w+)\")?(?:,\s*i)?\),\s*\{([^}]*)\},\s*([^)]*)\)",
                         body):
        tensor, suffix, shape, flags = m.groups()
        name = names[tensor].replace("%d", "0") + (f".{suffix}" if suffix else "")
        dims = tuple(_size(d, sizes) for d in shape.split(","))
        guarded = (f'get_tensor_meta("{name}")' in body or
                   f"get_tensor_meta(tn({tensor}" in body)  # created only when the file has it
        derived[name] = (dims, "TENSOR_NOT_REQUIRED" not in flags and not guarded)
    assert len(derived) >= 18
    header = compat._Header(
        "draft.gguf",
        {"general.architecture": "eagle3", "eagle3.embedding_length": e, "eagle3.feed_forward_length": f,
         "eagle3.attention.head_count": heads, "eagle3.attention.head_count_kv": kv,
         "eagle3.attention.key_length": head, "eagle3.attention.value_length": head,
         "eagle3.rope.dimension_count": n_rot, "eagle3.target_hidden_size": target, "eagle3.norm_before_fc": True,
         "tokenizer.ggml.tokens": tuple(str(i) for i in range(vocab))},
        {}, {"d2t": SimpleNamespace(shape=(d2t,))})
    assert compat.draft_tensor_shapes(header) == derived


def test_the_quantizer_file_types():
    # quantize.FILE_TYPES: llama-quantize's names (QUANT_OPTIONS, tools/quantize/quantize.cpp)
    # with their llama_ftype values (include/llama.h), none needing an importance matrix
    ftypes = _enum(_read("include/llama.h"), "llama_ftype")
    options = dict(re.findall(r'\{\s*"(\w+)",\s*(LLAMA_FTYPE_\w+),', _read("tools/quantize/quantize.cpp")))
    assert {name: ftypes[options[name]] for name in quantize.FILE_TYPES} == quantize.FILE_TYPES

    quant = _uncommented(_read("src/llama-quant.cpp"))
    default_type, pending = {}, []
    body = re.search(r"ggml_type llama_ftype_get_default_type\(llama_ftype ftype\) \{(.*?)\n\}", quant, re.S).group(1)
    for case, ret in re.findall(r"case (LLAMA_FTYPE_\w+):\s*(?:return (GGML_TYPE_\w+);)?", body):
        pending.append(case)
        if ret:
            default_type.update(dict.fromkeys(pending, ret))
            pending = []
    needs = re.search(r"static bool tensor_requires_imatrix\(.*?\n\}", quant, re.S).group(0)
    always = set(re.findall(r"case (GGML_TYPE_\w+):", needs.split("return true;")[0]))
    by_ftype = set(re.findall(r"ftype == (LLAMA_FTYPE_\w+)", needs))
    assert always and by_ftype
    by_value = {v: k for k, v in ftypes.items()}
    for name, value in quantize.FILE_TYPES.items():
        ftype = by_value[value]
        assert default_type.get(ftype) not in always and ftype not in by_ftype, name


# ---------------------------------------------------------------------------
# Limits and values the binding uses
# ---------------------------------------------------------------------------

def test_llama_cpps_limits():
    # _core.MAX_SEQ, MAX_LAYERS and MAX_EXPERTS (the shim returns the #defines it was compiled with)
    assert _core.MAX_SEQ == _define(_read("src/llama-cparams.h"), "LLAMA_MAX_SEQ")
    assert _core.MAX_LAYERS == _define(_read("src/llama-hparams.h"), "LLAMA_MAX_LAYERS")
    assert _core.MAX_EXPERTS == _define(_read("src/llama-hparams.h"), "LLAMA_MAX_EXPERTS")


@needs_repo
def test_the_longest_draft():
    # the shim's max_draft: common_speculative_accept takes the accepted count as a uint16_t
    m = re.search(r"void common_speculative_accept\([^)]*?\b(u?int\d+_t) \w*\)", _read("common/speculative.h"))
    assert m and m.group(1) == "uint16_t"
    shim = SHIM.read_text()
    assert int(re.search(r"constexpr int32_t max_draft = (\d+);", shim).group(1)) == 2 ** 16 - 1


@needs_repo
def test_the_draft_model_vocabulary_rule():
    # e3_vocab_compatible (shim) repeats draft-simple's check (common/speculative.cpp)
    spec, shim = _read("common/speculative.cpp"), SHIM.read_text()
    assert int(re.search(r"max_size_difference = (\d+);", shim).group(1)) == \
        _define(spec, "SPEC_VOCAB_MAX_SIZE_DIFFERENCE")
    assert int(re.search(r"first_checked_id = (\d+);", shim).group(1)) == \
        _define(spec, "SPEC_VOCAB_CHECK_START_TOKEN_ID")


@needs_repo
def test_the_ngram_parameter_ranges():
    # e3_spec_check_config's ranges (shim) are common/arg.cpp's for the --spec-ngram-* options
    fields = {"size-n": "size_n", "size-m": "size_m", "min-hits": "min_hits", "n-match": "n_match",
              "n-min": "mod_n_min", "n-max": "mod_n_max"}
    arg = _read("common/arg.cpp")
    ranges: dict[str, set[tuple[int, int | None]]] = {}
    for m in re.finditer(r'\{"--spec-ngram-(?:simple|map-k|map-k4v|mod)-([a-z-]+)"\}(.*?)\)\.set_', arg, re.S):
        if r := re.search(r"between (\d+) and (\d+) inclusive", m.group(2)):
            span = (int(r.group(1)), int(r.group(2)))
        else:
            span = (int(re.search(r"must be at least (\d+)", m.group(2)).group(1)), None)
        ranges.setdefault(fields[m.group(1)], set()).add(span)
    assert len(ranges) == 6 and all(len(spans) == 1 for spans in ranges.values()), ranges
    derived = {name: spans.pop() for name, spans in ranges.items()}
    # no upper bound in arg.cpp: the field's type gives it
    common = _read("common/common.h")
    for name, (lo, hi) in list(derived.items()):
        if hi is None:
            bits = int(re.search(rf"uint(\d+)_t\s+{name}\b", common).group(1))
            derived[name] = (lo, 2 ** bits - 1)
    table = re.search(r"ranges\[\] = \{(.*?)\};", SHIM.read_text(), re.S).group(1)
    shim = {name: (int(lo), int(hi)) for name, lo, hi in re.findall(r"\{g\.(\w+), (\d+), (\d+), \"\w+\"\}", table)}
    assert shim == derived


def test_ggml_log_levels_and_commons_verbosity():
    # _logging._LEVELS maps ggml_log_level's values (ggml.h); _COMMON_VERBOSITY is
    # LOG_LEVEL_TRACE (common/log.h), the level of common/'s statistics lines
    levels = _enum(_read("ggml/include/ggml.h"), "ggml_log_level")
    python = {"NONE": logging.INFO, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
              "ERROR": logging.ERROR}
    assert {levels[f"GGML_LOG_LEVEL_{name}"]: level for name, level in python.items()} == _logging._LEVELS
    assert _logging._COMMON_VERBOSITY == _define(_read("common/log.h"), "LOG_LEVEL_TRACE")


def test_the_rpc_servers_default_port_and_warning():
    # remote.DEFAULT_PORT and NO_AUTHENTICATION_WARNING: tools/rpc/rpc-server.cpp's
    server = _read("tools/rpc/rpc-server.cpp")
    assert int(re.search(r"\bint\s+port\s*=\s*(\d+);", server).group(1)) == remote.DEFAULT_PORT
    block = re.search(r'if \(params\.host != "127\.0\.0\.1"\) \{(.*?)\n\s*\}', server, re.S).group(1)
    printed = "".join(re.findall(r'fprintf\(stderr, "([^"]*)"', block))
    printed = printed.replace("\\n", "\n").replace("%s", "{host}")
    assert printed.strip("\n") == remote.NO_AUTHENTICATION_WARNING.strip("\n")


def test_the_converters_output_types():
    # convert.OUTTYPES: choices of convert_hf_to_gguf.py --outtype
    m = re.search(r'"--outtype", type=str, choices=\[([^\]]*)\]', _read("convert_hf_to_gguf.py"))
    assert set(convert.OUTTYPES) <= set(re.findall(r'"(\w+)"', m.group(1)))


# ---------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------

def _cmake_libraries(backends: tuple[str, ...]) -> tuple[dict[str, set[str]], dict[str, str]]:
    """The libraries llama.cpp's CMake files define, what each links, and the kind of each
    (STATIC where BUILD_SHARED_LIBS is off, INTERFACE, ...); ggml's backends are
    ``backends`` (ggml_add_backend names)."""
    kinds: dict[str, str] = {}
    links: dict[str, set[str]] = {}
    alias: dict[str, str] = {}
    for path in sorted(ROOT.glob("**/CMakeLists.txt")):
        rel = path.relative_to(ROOT).parts
        if rel[0] not in ("common", "src", "ggml", "vendor") or "tests" in rel or "examples" in rel:
            continue
        target = None
        text = re.sub(r"#[^\n]*", "", path.read_text())
        for m in re.finditer(r"\b(set|add_library|target_link_libraries)\s*\(([^)]*)\)", text):
            args = [target if a == "${TARGET}" else a for a in m.group(2).split()]
            if m.group(1) == "set" and args[:1] == ["TARGET"]:
                target = args[1]
            elif m.group(1) == "add_library" and args and "$" not in args[0]:
                if len(args) > 2 and args[1] == "ALIAS":
                    alias[args[0]] = args[2]
                else:
                    kind = [a for a in args[1:] if a in ("INTERFACE", "IMPORTED", "MODULE", "SHARED", "OBJECT")]
                kinds[args[0]] = "IMPORTED" if "IMPORTED" in kind else (kind or ["STATIC"])[0]
            elif m.group(1) == "target_link_libraries" and args and "$" not in args[0]:
                links.setdefault(args[0], set()).update(a for a in args[1:] if a not in ("PUBLIC", "PRIVATE",
                                                                                          "INTERFACE"))
    for backend in backends:  # ggml_add_backend_library: ggml links it, it links ggml-base
        name = f"ggml-{backend.lower()}"
        kinds[name] = "STATIC"
        links.setdefault("ggml", set()).add(name)
        links.setdefault(name, set()).add("ggml-base")
    graph = {lib: {alias.get(d, d) for d in links.get(lib, ()) if alias.get(d, d) in kinds} for lib in kinds}
    return graph, kinds


@needs_repo
def test_the_static_libraries_the_extension_links():
    # build_support/llama_cpp.py LIBRARIES: what `cmake --build --target llama-common` makes,
    # in link order (every library before those it links)
    bs = _load_build_support()
    graph, kinds = _cmake_libraries(("CPU", "RPC"))
    reachable, todo = set(), ["llama-common"]
    while todo:
        lib = todo.pop()
        if lib not in reachable:
            reachable.add(lib)
            todo += graph.get(lib, ())
    static = {f"lib{lib}.a" for lib in reachable if kinds[lib] == "STATIC"}
    assert static == set(bs.LIBRARIES)
    position = {lib: i for i, lib in enumerate(bs.LIBRARIES)}
    for lib in reachable:
        for dep in graph.get(lib, ()):
            if kinds[lib] == kinds[dep] == "STATIC":
                assert position[f"lib{lib}.a"] < position[f"lib{dep}.a"], (lib, dep)
    assert bs.RPC_LIBRARY in bs.LIBRARIES


def test_the_pinned_commit():
    # build_support/llama_cpp.py PINNED_COMMIT (_build_config.LLAMA_CPP_COMMIT): the vendored
    # tree is a git checkout in the sdist (vendor/llama.cpp/.git names its git folder)
    gitfile = ROOT / ".git"
    if not gitfile.is_file() or not gitfile.read_text().startswith("gitdir: "):
        pytest.skip("the llama.cpp tree carries no git folder")
    head = (ROOT / gitfile.read_text().split(None, 1)[1].strip() / "HEAD")
    if not head.is_file():
        pytest.skip("the llama.cpp tree's git folder is not here")
    assert head.read_text().strip().startswith(_build_config.LLAMA_CPP_COMMIT)


# Not derived again here:
# - the drafter table of eagle3_shim.cpp (whether a kind has a draft context, reads hidden
#   states, and how many draft-side rows accept() keeps): behaviour of common/speculative's
#   drafters, not a literal of it; tests/test_drafters.py and tests/test_state.py check it.
# - compat's d2t rules (a 1-D int64 tensor whose values are target token ids): common/
#   speculative reads d2t's data as int64_t token ids; a regular expression over that code
#   would say less than tests/test_fail_closed.py's drafts with bad d2t maps do.
# - which file types quantize.FILE_TYPES offers, and convert.OUTTYPES: eagle3's choice
#   among llama.cpp's (the tests above check that each is one of them).
# - _core's GGUF type names ("uint32", "array[int32]"): eagle3's own spelling.
# - the n-gram cache file format the shim checks (check_ngram_cache_file): its record size
#   comes from LLAMA_NGRAM_MAX at compile time; the layout follows common_ngram_cache_save,
#   and tests/test_drafters.py loads files llama.cpp's own writer made.
