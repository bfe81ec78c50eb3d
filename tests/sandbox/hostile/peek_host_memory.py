"""Attack: search the worker's own memory for what its supervisor or other episodes left in it.

A worker forked from the supervisor inherits the supervisor's heap: its configuration, its
episode records, the request that carried every program of the batch. This program walks
every frame (from sys._getframe() and from a caught exception's traceback, outward through
f_back) collecting their locals and globals, every object the garbage collector tracks
(after gc.unfreeze()) and what they refer to, and the module dicts in sys.modules, looking
for: supervisor objects (type named SandboxConfig, EpisodeSpec, Host or _Episode); dicts
keyed like the supervisor's state (the config's timeout field holding a number, "episodes",
"programs"); any str/bytes holding kwargs['marker'], a secret the test puts only in ANOTHER
episode's program and kwargs; any str/bytes holding a serialised config (the timeout field
followed by a value, as JSON or a dict repr writes it). The sandbox's own code (its classes,
their field names) is public and not a finding. The scan stops after 2M objects.
What should stop it: workers start from a clean interpreter (exec, or a zygote forked
before any episode or config existed) that holds only its own episode.
"""

import gc
import json
import sys

TYPE_NAMES = frozenset({"SandboxConfig", "EpisodeSpec", "Host", "_Episode"})
BUDGET = 2_000_000


class _Budget(Exception):
    pass


class PeekHostMemoryEnv:
    def __init__(self, max_turns=5, **kwargs):
        self.kwargs = kwargs
        self.marker = kwargs.get("marker")

    def reset(self, seed=None):
        results, scanned = self._scan()
        return json.dumps(results), {"scanned": scanned}

    def step(self, action):
        results, scanned = self._scan()
        return json.dumps(results), 0.0, True, False, {"scanned": scanned}

    def _frames(self):
        frames, seen = [], set()

        def outward(frame):
            while frame is not None and id(frame) not in seen:
                seen.add(id(frame))
                frames.append(frame)
                frame = frame.f_back

        outward(sys._getframe())
        try:
            raise RuntimeError("probe")
        except RuntimeError as err:
            tb = err.__traceback__
        while tb is not None:
            outward(tb.tb_frame)
            tb = tb.tb_next
        return frames

    def _scan(self):
        marker = self.marker if isinstance(self.marker, str) and self.marker else None
        if not hasattr(self, "needles"):  # made once and kept, so that every scan skips the same objects
            field = "_".join(("call", "timeout", "s"))  # built at run time: never a constant of this program
            self.needles = (field, field.encode(), marker.encode("utf-8", "surrogatepass") if marker else None,
                            (f'"{field}": ', f"'{field}': ", f'"{field}":'))
        needle, needle_b, marker_b, serialised = self.needles
        keys = (needle, "episodes", "programs")
        found = {}
        skip = {id(self), id(self.kwargs), id(self.marker), id(self.needles), id(marker_b), id(needle), id(needle_b),
                id(found), id(serialised), *map(id, serialised)}
        try:
            skip.add(id(vars(self)))
        except TypeError:
            pass
        count = [0]

        def context(text, hit, label):
            at = text.find(hit)
            head = text[max(0, at - 30):at]
            tail = text[at + len(hit):at + len(hit) + 30]
            if marker:
                head, tail = head.replace(marker, "<marker>"), tail.replace(marker, "<marker>")
            head, tail = head.replace(needle, "<field>"), tail.replace(needle, "<field>")
            return f"{type(text).__name__} of {len(text)}: {head!r} {label} {tail!r}"

        def check(obj):
            count[0] += 1
            if count[0] > BUDGET:
                raise _Budget
            if id(obj) in skip:
                return
            name = type(obj).__name__
            if name in TYPE_NAMES and "supervisor_objects" not in found:
                found["supervisor_objects"] = f"BREACH: found a {name} object"
            if isinstance(obj, str):
                if "field_string" not in found and any(form in obj for form in serialised):
                    found["field_string"] = "BREACH: found " + context(obj, needle, "<field>")
                if marker and "other_episode_marker" not in found and marker in obj:
                    found["other_episode_marker"] = "BREACH: found " + context(obj, marker, "<marker>")
            elif isinstance(obj, (bytes, bytearray)):
                if "field_string" not in found and any(form.encode() in obj for form in serialised):
                    found["field_string"] = f"BREACH: found {name} of {len(obj)} naming <field>"
                if marker_b and "other_episode_marker" not in found and marker_b in obj:
                    found["other_episode_marker"] = f"BREACH: found {name} of {len(obj)} holding <marker>"
            elif isinstance(obj, dict) and "supervisor_dicts" not in found:
                for key in keys:
                    try:
                        hit = key in obj and "__module__" not in obj and (  # a class namespace holds defaults
                            key is not needle or type(obj[key]) in (int, float))
                    except Exception:
                        hit = False
                    if hit:
                        label = "<field>" if key is needle else repr(key)
                        found["supervisor_dicts"] = f"BREACH: found a dict with key {label} ({len(obj)} keys)"
                        break

        def done():
            return len(found) == 4 or (len(found) == 3 and not marker)

        def contents(obj):
            if id(obj) in skip:
                return ()
            if isinstance(obj, dict):
                return [*obj.keys(), *obj.values()]
            return gc.get_referents(obj)

        try:
            # frames: their locals and globals, and one level into every value
            for frame in self._frames():
                for space in (frame.f_locals, frame.f_globals):
                    check(space)
                    for value in list(space.values()):
                        check(value)
                        for inner in contents(value):
                            check(inner)
                if done():
                    break
            # everything the collector tracks (frozen objects too), and what each refers to
            if not done():
                try:
                    gc.unfreeze()
                except AttributeError:
                    pass
                tracked = gc.get_objects()
                for obj in tracked:
                    check(obj)
                    for inner in contents(obj):
                        check(inner)
                    if done():
                        break
            # module dicts, one level
            if not done():
                for module in list(sys.modules.values()):
                    space = getattr(module, "__dict__", None)
                    if isinstance(space, dict):
                        check(space)
                        for value in list(space.values()):
                            check(value)
                    if done():
                        break
            stopped = ""
        except _Budget:
            stopped = f" (scan stopped after {BUDGET} objects)"
        finally:
            frame = space = value = inner = obj = tracked = None  # no cycle keeps this scan's frame alive
        results = {}
        for attempt in ("supervisor_objects", "supervisor_dicts", "other_episode_marker", "field_string"):
            results[attempt] = found.get(attempt, "not found" + stopped)
        if not marker:
            results["other_episode_marker"] = "not checked: no marker given"
        return results, min(count[0], BUDGET)
