"""No code outside the codecs decides by a codec's name or reads its spec text.

What a layer above the codecs needs to know of one (whether it is sparse, element-wise, sends
late, its variance bound, its start steps, ...) it reads from the codec's properties
(gcomp::CodecProperties, gcomp.Codec.properties), so that a new codec is described in its own
file and nowhere else. This test looks through the code outside compressors/ and cuda/ for the
shapes such a decision takes:
  - a comparison with a codec's name ("sign" == name, name != 'fp16'),
  - a membership test in a list of names (name in ("sign", "terngrad")),
  - a prefix test on one (spec.rfind("qsgd:", 0), spec.startswith("topk")),
  - spec text taken apart (spec.split(":"), a regular expression, find("bits=")).
Building a codec from a literal spec (Codec("fp16")) is use, not a decision, and passes.

The names are read from CodecKind in include/gcomp/codec.hpp. Before it looks at the tree, the
test runs its patterns on lines that decide by name and on lines that do not, so a pattern that
stopped matching fails here rather than passing everything.

  codec_names_test.py SOURCE_DIR
"""
import pathlib
import re
import sys

FOLDERS = ("bench", "collectives", "include", "python", "tools", "trainer")
SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".py"}


def codec_names(source):
    text = (source / "include/gcomp/codec.hpp").read_text()
    body = re.search(r"enum class CodecKind[^{]*\{(.*?)\};", text, re.S)
    if not body:
        sys.exit("codec_names_test: no CodecKind in include/gcomp/codec.hpp")
    names = re.findall(r"^\s*([a-z0-9_]+)\s*=", body.group(1), re.M)
    if len(names) < 2:
        sys.exit(f"codec_names_test: CodecKind's names not found ({names})")
    return names


def patterns(names):
    n = "|".join(map(re.escape, names))
    lit = rf"""["'](?:{n})(?::[^"']*)?["']"""  # "sign", 'qsgd:bits=4'
    return [
        ("a comparison with a codec's name", re.compile(rf"(?:[=!]=\s*{lit})|(?:{lit}\s*[=!]=)")),
        ("a membership test in codec names",
         re.compile(rf"\bin\s*[(\[{{][^)\]}}]*{lit}")),
        ("a prefix test on a codec's name",
         re.compile(rf"""(?:startswith|rfind|find|compare|starts_with)\(\s*["'](?:{n})[:"']""")),
        ("spec text taken apart",
         re.compile(r"""\.spec\b\S*\.(?:split|partition|find|rfind|substr)\(|"""
                    r"""\bre\.(?:search|match|fullmatch|findall)\(\s*r?["'][^"']*\w=|"""
                    r"""\bfind\(\s*(?:["'][a-z_]+=["']|\w+\s*\+\s*["']=["'])""")),
    ]


# Lines that must be caught, and lines that must pass, for the patterns' own check.
CAUGHT = [
    'return name in ("sign", "terngrad")',
    'return name not in ("none", "fp16", "bf16", "threshold")',
    'c.spec.split(":")[0] == "sign")',
    'if (spec != "dgc" && spec.rfind("qsgd:", 0) != 0) return d;',
    'if kind == \'topk\':',
    'm = re.search(r"(?:^|[:,])start=(\\d+)", _codec_or_none(codec).spec)',
    'const std::size_t at = spec.find(key + "=");',
    'name = c.spec.split(":")[0]',
]
PASSED = [
    'static const Codec fp16("fp16");',
    'comm.allreduce(v, "none", algorithm="dense")',
    'for (const char* spec : {"topk:ratio=0.01", "qsgd:bits=4", "sign", "fp16"}) {',
    'return props["split_per_tensor"]',
    'if (k.kind() == CodecKind::none) return Algorithm::dense;',
]


def self_check(pats):
    wrong = []
    for line in CAUGHT:
        if not any(p.search(line) for _, p in pats):
            wrong.append(f"not caught: {line}")
    for line in PASSED:
        hits = [what for what, p in pats if p.search(line)]
        if hits:
            wrong.append(f"caught ({hits[0]}): {line}")
    return wrong


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.rstrip().splitlines()[-1].strip())
    source = pathlib.Path(sys.argv[1])
    names = codec_names(source)
    pats = patterns(names)
    wrong = self_check(pats)
    if wrong:
        print("codec_names_test: the patterns are wrong:\n  " + "\n  ".join(wrong))
        return 1
    found, files = [], 0
    for folder in FOLDERS:
        for path in sorted((source / folder).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            files += 1
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                code = line.split("//")[0] if path.suffix != ".py" else line.split("#")[0]
                for what, p in pats:
                    if p.search(code):
                        found.append(f"{path.relative_to(source)}:{number}: {what}: "
                                     f"{line.strip()}")
                        break
    if files < 20:
        print(f"codec_names_test: only {files} files looked at under {source}: wrong folder?")
        return 1
    if found:
        print("codec_names_test: code outside compressors/ and cuda/ decides by a codec's name "
              "or spec text; read its properties instead:\n  " + "\n  ".join(found))
        return 1
    print(f"codec_names_test: {files} files, {len(names)} codec names, no decision by name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
