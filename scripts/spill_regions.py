#!/usr/bin/env python3
"""Where a warp-specialized kernel's local-memory spills are: the producer's or the consumers' branch,
and whether a consumer spill sits in the K loop.

ptxas -v reports spills per kernel; this attributes each STL/LDL of the SASS. The branch is CFG
reachability from the instruction after `USETMAXREG.DEALLOC` (producer) or after the retry loop of
`USETMAXREG.TRY_ALLOC` (consumers); what neither reaches is the prologue. A consumer spill counts
as in the K loop when it lies in a natural loop that holds an HGMMA and contains no other such loop,
or (with line info: objects compiled with -lineinfo) when it is inlined from the `consume_tile` call
in src/gemm/mainloop.cuh; the rest of the consumers' spills are once per tile or per CTA.

  scripts/spill_regions.py [--bin DIR] [--verbose] OBJECT...

DIR holds cuobjdump and nvdisasm (default: $CUDA_HOME/bin, else /usr/local/cuda/bin). OBJECT: a .o
or .cubin for sm_90a. Prints a line per kernel with spills, then a summary line per object.
"""
import argparse
import collections
import os
import pathlib
import re
import subprocess
import sys
import tempfile

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LINE_INFO = re.compile(r"^\s*//## File \"([^\"]+)\", line (\d+)")
LOCAL = re.compile(r"\b(STL|LDL)\b")


def split_predicate(text):
    m = re.match(r"(@!?U?P[T0-9]+)\s+(.*)", text)
    return (m.group(1), m.group(2)) if m else (None, text)


def control_flow(text):
    """(branch targets or None, falls through)"""
    predicate, body = split_predicate(text)
    opcode = body.split()[0]
    conditional = predicate not in (None, "@PT")
    if opcode.startswith("BRA") or opcode == "WARPSYNC.COLLECTIVE":
        target = int(re.findall(r"0x([0-9a-f]+)", body)[-1], 16)
        return [target], not (opcode == "BRA" and not conditional)
    if opcode == "EXIT":
        return [], conditional
    return None, True


def sass_functions(text):
    name, instructions = None, []
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                yield name, instructions
            name, instructions = m.group(1), []
        elif name and (m := INSTRUCTION.match(line)):
            instructions.append((int(m.group(1), 16), m.group(2)))
    if name:
        yield name, instructions


def line_info(text):
    """kernel -> {address: inline chain of 'file:line', innermost first} for the local-memory accesses"""
    chains = collections.defaultdict(dict)
    kernel, chain, in_block = None, [], False
    for line in text.splitlines():
        if m := re.match(r"^\.text\.(\S+):", line):
            kernel, chain, in_block = m.group(1), [], False
        elif m := LINE_INFO.match(line):
            if not in_block:
                chain, in_block = [], True
            chain.append(f"{m.group(1)}:{m.group(2)}")
        elif kernel and (m := INSTRUCTION.match(line)):
            in_block = False
            if LOCAL.search(m.group(2)):
                chains[kernel][int(m.group(1), 16)] = chain
    return chains


class Cfg:
    def __init__(self, instructions):
        index = {address: i for i, (address, _) in enumerate(instructions)}
        leaders = {0}
        for i, (_, text) in enumerate(instructions):
            targets, _ = control_flow(text)
            if targets is not None:
                leaders.update(index[t] for t in targets if t in index)
                leaders.add(i + 1)
        leaders = sorted(x for x in leaders if x < len(instructions))
        self.blocks = [(s, leaders[k + 1] if k + 1 < len(leaders) else len(instructions)) for k, s in enumerate(leaders)]
        self.block_of = {}
        for b, (s, e) in enumerate(self.blocks):
            for i in range(s, e):
                self.block_of[i] = b
        self.succ = [[] for _ in self.blocks]
        for b, (s, e) in enumerate(self.blocks):
            targets, falls_through = control_flow(instructions[e - 1][1])
            self.succ[b] += [self.block_of[index[t]] for t in targets or [] if t in index]
            if falls_through and e < len(instructions):
                self.succ[b].append(b + 1)
        self.pred = collections.defaultdict(list)
        for b, ss in enumerate(self.succ):
            for s in ss:
                self.pred[s].append(b)

    def reach(self, start):
        seen, todo = set(), [start]
        while todo:
            b = todo.pop()
            if b not in seen:
                seen.add(b)
                todo += self.succ[b]
        return seen

    def natural_loops(self):
        """header -> union of its natural loops' blocks (Cooper-Harvey-Kennedy dominators)"""
        order, seen, stack = [], {0}, [(0, iter(self.succ[0]))]
        while stack:
            b, it = stack[-1]
            for s in it:
                if s not in seen:
                    seen.add(s)
                    stack.append((s, iter(self.succ[s])))
                    break
            else:
                order.append(b)
                stack.pop()
        rpo = order[::-1]
        number = {b: i for i, b in enumerate(rpo)}
        idom, changed = {0: 0}, True
        while changed:
            changed = False
            for b in rpo[1:]:
                ps = [p for p in self.pred[b] if p in idom]
                new = ps[0]
                for p in ps[1:]:
                    x, y = p, new
                    while x != y:
                        while number[x] > number[y]:
                            x = idom[x]
                        while number[y] > number[x]:
                            y = idom[y]
                    new = x
                if idom.get(b) != new:
                    idom[b], changed = new, True

        def dominates(a, b):
            while a != b:
                if idom[b] == b:
                    return False
                b = idom[b]
            return True

        loops = collections.defaultdict(set)
        for b in idom:
            for h in self.succ[b]:
                if h in idom and dominates(h, b):
                    body, todo = {h}, [b]
                    while todo:
                        x = todo.pop()
                        if x not in body:
                            body.add(x)
                            todo += self.pred[x]
                    loops[h] |= body
        return loops


def kernel_spills(instructions, chains, consume_tile_line):
    cfg = Cfg(instructions)
    find = lambda what: next((i for i, (_, t) in enumerate(instructions) if what in t), None)
    dealloc, alloc = find("USETMAXREG.DEALLOC"), find("USETMAXREG.TRY_ALLOC")
    region = collections.defaultdict(lambda: "no_setmaxnreg")
    if dealloc is not None and alloc is not None:
        retry = alloc
        while control_flow(instructions[retry][1])[0] is None:
            retry += 1
        consumer, producer = cfg.reach(cfg.block_of[retry + 1]), cfg.reach(cfg.block_of[dealloc + 1])
        for b in range(len(cfg.blocks)):
            region[b] = ("both" if b in producer else "consumer") if b in consumer else \
                        "producer" if b in producer else "prologue"
    has_hgmma = lambda body: any("HGMMA" in instructions[i][1] for b in body for i in range(*cfg.blocks[b]))
    k_loops = [frozenset(body) for body in cfg.natural_loops().values() if has_hgmma(body)]
    innermost = [body for body in k_loops if not any(other < body for other in k_loops)]
    counts = collections.Counter()
    rows = []
    for i, (address, text) in enumerate(instructions):
        if not LOCAL.search(split_predicate(text)[1].split()[0]):
            continue
        b = cfg.block_of[i]
        where = region[b]
        chain = chains.get(address, [])
        in_k_loop = any(b in body for body in innermost)
        in_consume_tile = consume_tile_line is not None and any(c.endswith(consume_tile_line) for c in chain)
        kind = "st" if "STL" in text else "ld"
        counts[f"{where}.{kind}"] += 1
        if where in ("consumer", "no_setmaxnreg") and (in_k_loop or in_consume_tile):
            counts["consumer_in_k_loop"] += 1
        rows.append((address, where, int(in_k_loop), int(in_consume_tile), chain[0] if chain else "", text))
    return counts, rows


def consume_tile_call(repo):
    path = repo / "src/gemm/mainloop.cuh"
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if re.search(r"^\s+consume_tile<", line):
            return f"src/gemm/mainloop.cuh:{n}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_bin = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin")
    parser.add_argument("--bin", default=default_bin, help="folder with cuobjdump and nvdisasm")
    parser.add_argument("--verbose", action="store_true", help="list every STL/LDL")
    parser.add_argument("objects", nargs="+")
    args = parser.parse_args()
    repo = pathlib.Path(__file__).resolve().parent.parent
    consume_tile_line = consume_tile_call(repo)
    tool = lambda name: os.path.join(args.bin, name)
    for obj in args.objects:
        sass = subprocess.run([tool("cuobjdump"), "-sass", obj], check=True, capture_output=True, text=True).stdout
        chains = {}
        with tempfile.TemporaryDirectory() as scratch:
            if obj.endswith(".cubin"):
                cubins = [os.path.abspath(obj)]
            else:
                subprocess.run([tool("cuobjdump"), "-xelf", "all", os.path.abspath(obj)], cwd=scratch, check=True,
                               capture_output=True)
                cubins = sorted(str(p) for p in pathlib.Path(scratch).glob("*.cubin"))
            for cubin in cubins:
                dis = subprocess.run([tool("nvdisasm"), "-gi", cubin], check=True, capture_output=True, text=True).stdout
                chains.update(line_info(dis))
        total, kernels, with_spills = collections.Counter(), 0, 0
        for name, instructions in sass_functions(sass):
            counts, rows = kernel_spills(instructions, chains.get(name, {}), consume_tile_line)
            kernels += 1
            total.update(counts)
            if rows:
                with_spills += 1
                print(f"{obj}\t{name}\t" + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
            if args.verbose:
                for address, where, in_k_loop, in_consume_tile, source, text in rows:
                    print(f"    {address:#07x} {where:9s} k_loop={in_k_loop} consume_tile={in_consume_tile} "
                          f"{source.split('/src/')[-1]:40s} {text}")
        summary = " ".join(f"{k}={v}" for k, v in sorted(total.items())) or "no local-memory accesses"
        print(f"{obj}: {kernels} kernels, {with_spills} with local-memory accesses; {summary}")
        if total["consumer_in_k_loop"]:
            print(f"{obj}: consumer spills in the K loop", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
