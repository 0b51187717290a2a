"""The collectives' layers (collectives/README.md): each folder includes only itself and below.

The include directories of collectives/CMakeLists.txt already keep a layer from compiling an
include that reaches up, or an algorithm from including <mpi.h> or Gloo. This test says the rules
the include paths cannot say, over the text of every file under collectives/:
  - every source file lies in a layer's folder (none at the top);
  - a quoted include names a file of its own layer or one below, and inside transport/ an engine's
    folder (mpi/, gloo/, sockets/) is included only by itself, by gloo/ (which runs on sockets/),
    or by api/;
  - the interface of the transports, the algorithms and planning include neither <mpi.h> nor
    Gloo nor gcomp/communicator.hpp (which takes an MPI_Comm), and their code names no MPI_ or
    gloo:: symbol;
  - planning and the call see the algorithms only through the table's contract headers, not an
    algorithm's own file;
  - the call names no algorithm (Algorithm::dense, Algorithm::two_level, ...; automatic and
    fewest_bytes are requests, not algorithms) and no transport (Transport::mpi, ::gloo): what
    differs is a row field (algorithm_table.hpp) or a transport method (transport.hpp).
Before it looks at the tree, the test runs its patterns on lines that break a rule and on lines
that do not, so a pattern that stopped matching fails here rather than passing everything.

  layers_test.py SOURCE_DIR
"""
import pathlib
import re
import sys

# The layers, bottom up: a file may include its own layer and those before it.
LAYERS = ["transport", "algorithms", "planning", "call", "api"]
# Folders that belong to a layer without being named for it.
LAYER_OF = {"optimizers": "api"}
# Inside transport/: the engines' folders, and who may include each.
ENGINES = {"mpi": {"mpi", "api"}, "gloo": {"gloo", "api"}, "sockets": {"sockets", "gloo", "api"}}
# The algorithms' contract: what every algorithm, planning and the call share. Any other file of
# algorithms/ belongs to one algorithm.
CONTRACT = {"algorithms.hpp", "algorithm_table.hpp", "model_terms.hpp", "calibration.hpp",
            "workspace.hpp", "sparse_vector.hpp"}
# Layers that must not see an engine (transport/'s own files: its interface, groups, host memory).
NO_ENGINE = {"transport", "algorithms", "planning"}
SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".cuh"}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
ENGINE_HEADER = re.compile(r"^(?:mpi\.h|gloo/.*|gcomp/communicator\.hpp)$")
ENGINE_SYMBOL = re.compile(r"\bMPI_[A-Za-z]\w*|\bgloo::")
NAMED_ALGORITHM = re.compile(r"\bAlgorithm::(?!automatic\b|fewest_bytes\b)[a-z_]+")
NAMED_TRANSPORT = re.compile(r"\bTransport::(?:mpi|gloo)\b")

# Lines the patterns must catch, and lines they must pass.
CAUGHT = [
    (ENGINE_SYMBOL, "MPI_Comm comm = MPI_COMM_NULL;"),
    (ENGINE_SYMBOL, "gloo::AllreduceOptions opts(ctx_);"),
    (NAMED_ALGORITHM, "if (alg == Algorithm::compressed_reduce_scatter) return;"),
    (NAMED_ALGORITHM, "opt.algorithm = Algorithm::dense;"),
    (NAMED_TRANSPORT, "net_->kind() == Transport::gloo ? WaitPolicy::sleep : mode"),
]
PASSED = [
    (ENGINE_SYMBOL, "const int mpi_rank = rank();"),
    (NAMED_ALGORITHM, "if (requested == Algorithm::automatic) return;"),
    (NAMED_ALGORITHM, "requested == Algorithm::fewest_bytes"),
    (NAMED_TRANSPORT, "gcomp::Transport kind() const noexcept"),
]


def check_patterns():
    bad = [f"not caught: {line}" for p, line in CAUGHT if not p.search(code_of(line))]
    bad += [f"caught: {line}" for p, line in PASSED if p.search(code_of(line))]
    for header in ("mpi.h", "gloo/allreduce.h", "gcomp/communicator.hpp"):
        if not ENGINE_HEADER.match(header):
            bad.append(f"not caught: #include <{header}>")
    if ENGINE_HEADER.match("gcomp/collective_types.hpp"):
        bad.append("caught: #include \"gcomp/collective_types.hpp\"")
    return bad


def code_of(text):
    """The text without comments and string literals (where MPI_Allreduce may be named)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def place(path, root):
    """(layer, engine or None) of a file under collectives/."""
    parts = path.relative_to(root).parts
    layer = LAYER_OF.get(parts[0], parts[0])
    engine = parts[1] if layer == "transport" and len(parts) > 2 else None
    return layer, engine


def main():
    source = pathlib.Path(sys.argv[1])
    root = source / "collectives"
    problems = check_patterns()
    files = [p for p in sorted(root.rglob("*")) if p.suffix in SUFFIXES]
    by_name = {}
    for p in files:
        by_name.setdefault(p.name, []).append(p)
    for name, paths in by_name.items():
        if len(paths) > 1:
            problems.append(f"{name} is in several folders: {[str(p) for p in paths]}")
    if len(files) < 40:
        problems.append(f"only {len(files)} files found under {root}")
    for path in files:
        rel = path.relative_to(source)
        if len(path.relative_to(root).parts) < 2:
            problems.append(f"{rel}: in no layer's folder")
            continue
        layer, engine = place(path, root)
        if layer not in LAYERS:
            problems.append(f"{rel}: {layer}/ is not a layer ({', '.join(LAYERS)})")
            continue
        text = path.read_text()
        code = code_of(text)
        for kind, header in INCLUDE.findall(text):
            if kind == "<" or ENGINE_HEADER.match(header):
                if layer in NO_ENGINE and engine is None and ENGINE_HEADER.match(header):
                    problems.append(f"{rel}: includes <{header}>; its layer sees no engine")
                continue
            target = by_name.get(pathlib.PurePath(header).name)
            if not target:
                continue  # compressors/, include/gcomp/: below every layer
            t_layer, t_engine = place(target[0], root)
            where = f"{rel}: includes {header} ({t_layer}/"
            if LAYERS.index(t_layer) > LAYERS.index(layer):
                problems.append(where + "), a layer above its own")
            if t_engine and t_engine != engine and (engine or layer) not in ENGINES[t_engine]:
                problems.append(where + f"{t_engine}/), an engine's own file")
            if (layer in ("planning", "call") and t_layer == "algorithms"
                    and target[0].name not in CONTRACT):
                problems.append(where + "), an algorithm's own file, not the table's contract")
        if layer in NO_ENGINE and engine is None:
            for m in ENGINE_SYMBOL.finditer(code):
                problems.append(f"{rel}: names {m.group(0)}; its layer sees no engine")
        if layer == "call":
            for m in NAMED_ALGORITHM.finditer(code):
                problems.append(f"{rel}: names {m.group(0)} (a row field answers)")
            for m in NAMED_TRANSPORT.finditer(code):
                problems.append(f"{rel}: names {m.group(0)} (a transport method answers)")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"layers_test: {len(files)} files in {len(LAYERS)} layers follow the rules")


if __name__ == "__main__":
    main()
