/* Optional compiled loops of the pure core, built by `make` (see native_build.py).
 *
 * Each function here is a line-for-line transcription of a Python function that stays the reference
 * (and the fallback when this module is not built): the same double operations in the same order, so
 * results are bitwise equal. tests/unit/test_native.py compares the two on random inputs.
 *
 *   earliest, latest  <-  passes/copy_plan.py  CopyGroup._earliest_python / _latest_python
 *   place, pack       <-  passes/copy_plan.py  CopyGroup._place_python / _pack_python
 *   simulate          <-  simulator.py         _Simulation._run_python (and intervals.Intervals.reserve)
 *
 * Lists passed in are Python lists of floats (copy lanes and grid points); nothing is copied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

static const double EPS = 1e-10; /* pipeoffload.intervals.EPS */

/* A float item of a list (ints are accepted too, as Python's comparisons would). */
static inline double item(PyObject *list, Py_ssize_t i) {
    PyObject *x = PyList_GET_ITEM(list, i);
    return PyFloat_CheckExact(x) ? PyFloat_AS_DOUBLE(x) : PyFloat_AsDouble(x);
}

/* bisect.bisect_left / bisect_right on a sorted list of floats */
static Py_ssize_t bisect_left(PyObject *list, double x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (item(list, mid) < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static Py_ssize_t bisect_right(PyObject *list, double x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < item(list, mid)) hi = mid; else lo = mid + 1;
    }
    return lo;
}

/* math.ulp */
static double ulp(double x) {
    if (isnan(x)) return x;
    x = fabs(x);
    if (isinf(x)) return x;
    double up = nextafter(x, INFINITY);
    if (isinf(up)) return x - nextafter(x, -INFINITY);
    return up - x;
}

static int lists_ok(PyObject *const *lists, int n) {
    for (int k = 0; k < n; k++) {
        if (!PyList_Check(lists[k])) {
            PyErr_SetString(PyExc_TypeError, "copy lanes and grid points must be lists of floats");
            return 0;
        }
    }
    return 1;
}

/* One copy's resources, as CopyGroup._search holds them: grid points, engine lane, link lane (the
   engine's when the host link is not shared), whether the link is shared. */
typedef struct { PyObject *clocks, *e_starts, *e_ends, *l_starts, *l_ends; int shared; } Lanes;

static int unpack_lanes(PyObject *tuple, Lanes *out) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 6) {
        PyErr_SetString(PyExc_TypeError, "lanes: expected (clocks, e_starts, e_ends, l_starts, l_ends, shared)");
        return 0;
    }
    out->clocks = PyTuple_GET_ITEM(tuple, 0);
    out->e_starts = PyTuple_GET_ITEM(tuple, 1);
    out->e_ends = PyTuple_GET_ITEM(tuple, 2);
    out->l_starts = PyTuple_GET_ITEM(tuple, 3);
    out->l_ends = PyTuple_GET_ITEM(tuple, 4);
    out->shared = PyObject_IsTrue(PyTuple_GET_ITEM(tuple, 5));
    PyObject *const lists[] = {out->clocks, out->e_starts, out->e_ends, out->l_starts, out->l_ends};
    return out->shared >= 0 && lists_ok(lists, 5);
}

/* CopyGroup._earliest_python: 1 and *out set, or 0 (None) */
static int find_earliest(const Lanes *ln, int relaxed, double t, double duration, double limit, double *out) {
    PyObject *clocks = ln->clocks, *e_starts = ln->e_starts, *e_ends = ln->e_ends;
    PyObject *l_starts = ln->l_starts, *l_ends = ln->l_ends;
    int shared = ln->shared;
    Py_ssize_t n_clocks = PyList_GET_SIZE(clocks), n_engine = PyList_GET_SIZE(e_ends);
    Py_ssize_t n_link = PyList_GET_SIZE(l_ends);
    double bound = limit + EPS, narrow = 0.0, apart = 0.0;
    int skip = !shared && !relaxed && n_engine > 1;
    if (skip) {
        double a = fabs(item(e_ends, n_engine - 1)), b = fabs(t), c = fabs(duration);
        double biggest = a;
        if (b > biggest) biggest = b;
        if (c > biggest) biggest = c;
        double slack = 3 * EPS + 8 * ulp(biggest);
        narrow = duration - slack;
        apart = 2 * EPS + slack;
    }
    double query = t;
    for (;;) {
        double low = query - EPS;
        Py_ssize_t p = bisect_left(clocks, low);
        int found = p < n_clocks;
        double cursor = found ? item(clocks, p) : 0.0;
        Py_ssize_t i = bisect_left(e_ends, low);
        if (i < n_engine && (!found || item(e_ends, i) < cursor)) {
            cursor = item(e_ends, i);
            found = 1;
        }
        if (relaxed) {
            i = bisect_left(l_ends, low);
            if (i < n_link && (!found || item(l_ends, i) < cursor)) {
                cursor = item(l_ends, i);
                found = 1;
            }
        }
        if (!found || cursor > bound) return 0;
        double reach = duration > 0 ? cursor + duration - EPS : cursor - EPS;
        double high = cursor + EPS;
        int is_blocked = 0;
        double blocked = 0.0;
        i = bisect_right(e_ends, high);
        if (i < n_engine && item(e_starts, i) < reach) {
            blocked = item(e_ends, i);
            is_blocked = 1;
            if (skip) {
                while (i + 1 < n_engine && item(e_starts, i + 1) - item(e_ends, i) < narrow
                       && item(e_ends, i + 1) - item(e_ends, i) > apart)
                    i += 1;
                blocked = item(e_ends, i);
            }
        }
        if (shared) {
            i = bisect_right(l_ends, high);
            if (i < n_link && item(l_starts, i) < reach && (!is_blocked || item(l_ends, i) > blocked)) {
                blocked = item(l_ends, i);
                is_blocked = 1;
            }
        }
        if (!is_blocked) { *out = cursor; return 1; }
        query = blocked;
    }
}

/* CopyGroup._latest_python: 1 and *out set, or 0 (None) */
static int find_latest(const Lanes *ln, int relaxed, double t, double duration, double lower, double *out) {
    PyObject *clocks = ln->clocks, *e_starts = ln->e_starts, *e_ends = ln->e_ends;
    PyObject *l_starts = ln->l_starts, *l_ends = ln->l_ends;
    int shared = ln->shared;
    Py_ssize_t n_engine = PyList_GET_SIZE(e_ends), n_link = PyList_GET_SIZE(l_ends);
    double bound = lower - EPS;
    double query = t;
    for (;;) {
        double high = query + EPS;
        Py_ssize_t p = bisect_right(clocks, high) - 1;
        int found = p >= 0;
        double cursor = found ? item(clocks, p) : 0.0;
        Py_ssize_t i = bisect_right(e_ends, high);
        if (i && (!found || item(e_ends, i - 1) > cursor)) {
            cursor = item(e_ends, i - 1);
            found = 1;
        }
        if (relaxed) {
            i = bisect_right(l_ends, high);
            if (i && (!found || item(l_ends, i - 1) > cursor)) {
                cursor = item(l_ends, i - 1);
                found = 1;
            }
        }
        if (!found || cursor < bound) return 0;
        double reach = duration > 0 ? cursor + duration - EPS : cursor - EPS;
        high = cursor + EPS;
        int is_blocked = 0;
        double blocked = 0.0;
        i = bisect_right(e_ends, high);
        if (i < n_engine && item(e_starts, i) < reach) {
            blocked = item(e_starts, i);
            is_blocked = 1;
        }
        if (shared) {
            i = bisect_right(l_ends, high);
            if (i < n_link && item(l_starts, i) < reach && (!is_blocked || item(l_starts, i) < blocked)) {
                blocked = item(l_starts, i);
                is_blocked = 1;
            }
        }
        if (!is_blocked) { *out = cursor; return 1; }
        query = blocked - duration;
    }
}

static PyObject *earliest(PyObject *self, PyObject *args) {
    PyObject *tuple;
    int relaxed;
    double t, duration, limit, out;
    Lanes ln;
    if (!PyArg_ParseTuple(args, "O!pddd", &PyTuple_Type, &tuple, &relaxed, &t, &duration, &limit)) return NULL;
    if (!unpack_lanes(tuple, &ln)) return NULL;
    if (find_earliest(&ln, relaxed, t, duration, limit, &out)) return PyFloat_FromDouble(out);
    Py_RETURN_NONE;
}

static PyObject *latest(PyObject *self, PyObject *args) {
    PyObject *tuple;
    int relaxed;
    double t, duration, lower, out;
    Lanes ln;
    if (!PyArg_ParseTuple(args, "O!pddd", &PyTuple_Type, &tuple, &relaxed, &t, &duration, &lower)) return NULL;
    if (!unpack_lanes(tuple, &ln)) return NULL;
    if (find_latest(&ln, relaxed, t, duration, lower, &out)) return PyFloat_FromDouble(out);
    Py_RETURN_NONE;
}

/* intervals.Intervals.add / remove on the engine lane, and the link lane when shared (CopyGroup.reserve) */
static int add_interval(PyObject *starts, PyObject *ends, double t, double duration) {
    if (duration <= 0) return 0;
    Py_ssize_t i = bisect_left(starts, t);
    PyObject *a = PyFloat_FromDouble(t), *b = PyFloat_FromDouble(t + duration);
    int bad = !a || !b || PyList_Insert(starts, i, a) < 0 || PyList_Insert(ends, i, b) < 0;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return bad ? -1 : 0;
}

static int remove_interval(PyObject *starts, PyObject *ends, double t, double duration) {
    if (duration <= 0) return 0;
    Py_ssize_t i = bisect_left(starts, t - EPS);
    if (i >= PyList_GET_SIZE(starts)) {
        PyErr_SetString(PyExc_IndexError, "release: no such copy on the lane");
        return -1;
    }
    if (PyList_SetSlice(starts, i, i + 1, NULL) < 0 || PyList_SetSlice(ends, i, i + 1, NULL) < 0) return -1;
    return 0;
}

static int reserve(const Lanes *ln, double t, double duration) {
    if (add_interval(ln->e_starts, ln->e_ends, t, duration) < 0) return -1;
    return ln->shared ? add_interval(ln->l_starts, ln->l_ends, t, duration) : 0;
}

static int release(const Lanes *ln, double t, double duration) {
    if (remove_interval(ln->e_starts, ln->e_ends, t, duration) < 0) return -1;
    return ln->shared ? remove_interval(ln->l_starts, ln->l_ends, t, duration) : 0;
}

/* copy_plan.RankTimeline.off_range */
static void off_range(PyObject *points, double d2h_end, double h2d_start, Py_ssize_t *lo, Py_ssize_t *hi) {
    *lo = bisect_left(points, d2h_end - EPS);
    *hi = bisect_right(points, h2d_start + EPS) - 1;
}

/* CopyGroup.place: (d2h, h2d, lo, hi) or None */
static PyObject *place(PyObject *self, PyObject *args) {
    PyObject *o_d2h, *o_h2d, *points;
    int relaxed;
    double f_end, deadline, d2h_time, h2d_time, d2h, h2d;
    Lanes down, up;
    if (!PyArg_ParseTuple(args, "O!O!O!pdddd", &PyTuple_Type, &o_d2h, &PyTuple_Type, &o_h2d, &PyList_Type, &points,
                          &relaxed, &f_end, &deadline, &d2h_time, &h2d_time))
        return NULL;
    if (!unpack_lanes(o_d2h, &down) || !unpack_lanes(o_h2d, &up)) return NULL;
    if (!find_earliest(&down, relaxed, f_end, d2h_time, deadline - h2d_time - d2h_time, &d2h)) Py_RETURN_NONE;
    if (reserve(&down, d2h, d2h_time) < 0) return NULL;
    if (!find_latest(&up, relaxed, deadline - h2d_time, h2d_time, d2h + d2h_time, &h2d)) {
        if (release(&down, d2h, d2h_time) < 0) return NULL;
        Py_RETURN_NONE;
    }
    if (reserve(&up, h2d, h2d_time) < 0) return NULL;
    Py_ssize_t lo, hi;
    off_range(points, d2h + d2h_time, h2d, &lo, &hi);
    return Py_BuildValue("(ddnn)", d2h, h2d, lo, hi);
}

/* CopyGroup._pack_python on arrays: per pick its rank's slot in ``ranks`` ((d2h lanes, h2d lanes,
   points) per slot), forward end, deadline, copy times; the two processing orders. Returns
   (placed: [(pick, d2h, h2d, lo, hi)], failed: [pick]) in the order the Python version lists them. */
static PyObject *pack(PyObject *self, PyObject *args) {
    PyObject *ranks, *o_slot, *o_f_end, *o_deadline, *o_d2h, *o_h2d, *o_order1, *o_order2;
    int relaxed;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!p", &PyTuple_Type, &ranks, &PyList_Type, &o_slot, &PyList_Type,
                          &o_f_end, &PyList_Type, &o_deadline, &PyList_Type, &o_d2h, &PyList_Type, &o_h2d,
                          &PyList_Type, &o_order1, &PyList_Type, &o_order2, &relaxed))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(o_slot), n_slots = PyTuple_GET_SIZE(ranks);
    PyObject *placed = PyList_New(0), *failed = PyList_New(0), *result = NULL;
    Lanes *down = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(Lanes));
    Lanes *up = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(Lanes));
    PyObject **points = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(PyObject *));
    Py_ssize_t *slot = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    double *f_end = PyMem_Calloc(n ? n : 1, sizeof(double)), *deadline = PyMem_Calloc(n ? n : 1, sizeof(double));
    double *d2h = PyMem_Calloc(n ? n : 1, sizeof(double)), *h2d = PyMem_Calloc(n ? n : 1, sizeof(double));
    double *reload = PyMem_Calloc(n ? n : 1, sizeof(double));
    char *reloaded = PyMem_Calloc(n ? n : 1, 1);
    /* the ``resume`` hint of the Python version: per slot, a few (duration, start) pairs */
    enum { HINTS = 16 };
    double *hint_time = PyMem_Calloc((n_slots ? n_slots : 1) * HINTS, sizeof(double));
    double *hint_start = PyMem_Calloc((n_slots ? n_slots : 1) * HINTS, sizeof(double));
    int *hints = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(int));
    if (!placed || !failed || !down || !up || !points || !slot || !f_end || !deadline || !d2h || !h2d || !reload
        || !reloaded || !hint_time || !hint_start || !hints) {
        PyErr_NoMemory();
        goto finally;
    }
    if (PyList_GET_SIZE(o_f_end) != n || PyList_GET_SIZE(o_deadline) != n || PyList_GET_SIZE(o_d2h) != n
        || PyList_GET_SIZE(o_h2d) != n || PyList_GET_SIZE(o_order1) != n || PyList_GET_SIZE(o_order2) != n) {
        PyErr_SetString(PyExc_ValueError, "pack: per-pick lists differ in length");
        goto finally;
    }
    for (Py_ssize_t k = 0; k < n_slots; k++) {
        PyObject *entry = PyTuple_GET_ITEM(ranks, k);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3 || !PyList_Check(PyTuple_GET_ITEM(entry, 2))) {
            PyErr_SetString(PyExc_TypeError, "pack: ranks must hold (d2h lanes, h2d lanes, points)");
            goto finally;
        }
        if (!unpack_lanes(PyTuple_GET_ITEM(entry, 0), &down[k]) || !unpack_lanes(PyTuple_GET_ITEM(entry, 1), &up[k]))
            goto finally;
        points[k] = PyTuple_GET_ITEM(entry, 2);
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        slot[j] = PyLong_AsSsize_t(PyList_GET_ITEM(o_slot, j));
        f_end[j] = item(o_f_end, j);
        deadline[j] = item(o_deadline, j);
        d2h[j] = item(o_d2h, j);
        h2d[j] = item(o_h2d, j);
        if (PyErr_Occurred()) goto finally;
        if (slot[j] < 0 || slot[j] >= n_slots) {
            PyErr_SetString(PyExc_IndexError, "pack: rank slot out of range");
            goto finally;
        }
    }
    for (Py_ssize_t q = 0; q < n; q++) { /* reloads, latest deadline first, each as late as it can go */
        Py_ssize_t j = PyLong_AsSsize_t(PyList_GET_ITEM(o_order1, q));
        if (j < 0 || j >= n) { PyErr_SetString(PyExc_IndexError, "pack: order out of range"); goto finally; }
        double start;
        if (!find_latest(&up[slot[j]], relaxed, deadline[j] - h2d[j], h2d[j], f_end[j] + d2h[j], &start)) {
            PyObject *index = PyLong_FromSsize_t(j);
            if (!index || PyList_Append(failed, index) < 0) { Py_XDECREF(index); goto finally; }
            Py_DECREF(index);
            continue;
        }
        if (reserve(&up[slot[j]], start, h2d[j]) < 0) goto finally;
        reload[j] = start;
        reloaded[j] = 1;
    }
    for (Py_ssize_t q = 0; q < n; q++) { /* offloads in order of their forwards, each as early as it can go */
        Py_ssize_t j = PyLong_AsSsize_t(PyList_GET_ITEM(o_order2, q));
        if (j < 0 || j >= n) { PyErr_SetString(PyExc_IndexError, "pack: order out of range"); goto finally; }
        if (!reloaded[j]) continue;
        Py_ssize_t k = slot[j];
        double after = f_end[j];
        for (int h = 0; h < hints[k]; h++)
            if (hint_time[k * HINTS + h] == d2h[j]) { after = hint_start[k * HINTS + h]; break; }
        double start;
        Py_ssize_t lo = 0, hi = 0;
        int ok = find_earliest(&down[k], relaxed, after > f_end[j] ? after : f_end[j], d2h[j], reload[j] - d2h[j],
                               &start);
        if (ok) off_range(points[k], start + d2h[j], reload[j], &lo, &hi);
        if (!ok || hi <= lo) {
            if (release(&up[k], reload[j], h2d[j]) < 0) goto finally;
            PyObject *index = PyLong_FromSsize_t(j);
            if (!index || PyList_Append(failed, index) < 0) { Py_XDECREF(index); goto finally; }
            Py_DECREF(index);
            for (Py_ssize_t z = 0; z < n_slots; z++) hints[z] = 0;
            continue;
        }
        if (reserve(&down[k], start, d2h[j]) < 0) goto finally;
        if (!relaxed) {
            int h = 0;
            while (h < hints[k] && hint_time[k * HINTS + h] != d2h[j]) h++;
            if (h < HINTS) {
                hint_time[k * HINTS + h] = d2h[j];
                hint_start[k * HINTS + h] = start;
                if (h == hints[k]) hints[k] += 1;
            }
        }
        PyObject *entry = Py_BuildValue("(nddnn)", j, start, reload[j], lo, hi);
        if (!entry || PyList_Append(placed, entry) < 0) { Py_XDECREF(entry); goto finally; }
        Py_DECREF(entry);
    }
    result = PyTuple_Pack(2, placed, failed);
finally:
    Py_XDECREF(placed);
    Py_XDECREF(failed);
    PyMem_Free(down);
    PyMem_Free(up);
    PyMem_Free(points);
    PyMem_Free(slot);
    PyMem_Free(f_end);
    PyMem_Free(deadline);
    PyMem_Free(d2h);
    PyMem_Free(h2d);
    PyMem_Free(reload);
    PyMem_Free(reloaded);
    PyMem_Free(hint_time);
    PyMem_Free(hint_start);
    PyMem_Free(hints);
    return result;
}


/* ---- the simulator's event loop ----------------------------------------------------------------- */

static const double STALL_TOL = 1e-9;   /* simulator._STALL_TOL */
static const double RESERVE_EPS = 1e-12; /* intervals.RESERVE_EPS */
enum { LANE_COMPUTE = 0, LANE_SEND = 1, LANE_RECV = 2, LANE_COPY = 3 };

typedef struct { double *starts, *ends; Py_ssize_t n, cap; } Link; /* intervals.Intervals */

static int link_reserve(Link *link, double ready, double duration, double *out) {
    Py_ssize_t lo = 0, hi = link->n; /* bisect_right(ends, ready) */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (ready < link->ends[mid]) hi = mid; else lo = mid + 1;
    }
    Py_ssize_t i = lo;
    double t = ready;
    while (i < link->n) {
        if (t + duration <= link->starts[i] + RESERVE_EPS) break;
        if (link->ends[i] > t) t = link->ends[i];
        i += 1;
    }
    if (link->n == link->cap) {
        Py_ssize_t cap = link->cap ? 2 * link->cap : 64;
        double *s = PyMem_Realloc(link->starts, cap * sizeof(double));
        if (!s) return -1;
        link->starts = s;
        double *e = PyMem_Realloc(link->ends, cap * sizeof(double));
        if (!e) return -1;
        link->ends = e;
        link->cap = cap;
    }
    memmove(link->starts + i + 1, link->starts + i, (link->n - i) * sizeof(double));
    memmove(link->ends + i + 1, link->ends + i, (link->n - i) * sizeof(double));
    link->starts[i] = t;
    link->ends[i] = t + duration;
    link->n += 1;
    *out = t;
    return 0;
}

/* A writable or read-only C-contiguous buffer of n items of the given size. */
static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n, int writable,
                      const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->itemsize != itemsize || view->len != itemsize * n) {
        PyErr_Format(PyExc_ValueError, "simulate: %s has the wrong size or item type", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *simulate(PyObject *self, PyObject *args) {
    /* inputs, per action (int8 lane, int64 keys, float64 delays/durations), per rank (int64 offsets),
       per copy action: engine, link (-1 elsewhere) and copy duration; outputs written in place */
    PyObject *o_lane, *o_key, *o_dep, *o_delay, *o_dep2, *o_delay2, *o_reload, *o_duration, *o_offsets;
    PyObject *o_engine, *o_link, *o_copy_duration, *o_start, *o_end, *o_busy, *o_stall, *o_pos, *o_wait;
    Py_ssize_t n_actions, n_ranks, n_keys, n_engines, n_links;
    if (!PyArg_ParseTuple(args, "nnnnnOOOOOOOOOOOOOOOOOO", &n_actions, &n_ranks, &n_keys, &n_engines, &n_links,
                          &o_lane, &o_key, &o_dep, &o_delay, &o_dep2, &o_delay2, &o_reload, &o_duration,
                          &o_offsets, &o_engine, &o_link, &o_copy_duration, &o_start, &o_end, &o_busy, &o_stall,
                          &o_pos, &o_wait))
        return NULL;
    PyObject *const objs[] = {o_lane, o_key, o_dep, o_delay, o_dep2, o_delay2, o_reload, o_duration, o_offsets,
                              o_engine, o_link, o_copy_duration, o_start, o_end, o_busy, o_stall, o_pos, o_wait};
    const char *names[] = {"lane", "key", "dep", "delay", "dep2", "delay2", "reload", "duration", "offsets",
                           "engine", "link", "copy_duration", "start", "end", "busy", "stall", "pos", "wait"};
    const Py_ssize_t sizes[] = {1, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    const Py_ssize_t counts[] = {n_actions, n_actions, n_actions, n_actions, n_actions, n_actions, n_actions,
                                 n_actions, n_ranks + 1, n_actions, n_actions, n_actions, n_actions, n_actions,
                                 n_ranks, n_ranks, n_ranks, n_ranks};
    enum { N_BUFFERS = 18, FIRST_OUTPUT = 12 };
    Py_buffer views[N_BUFFERS];
    int got = 0;
    PyObject *result = NULL, *stalled = NULL;
    double *done = NULL, *engine_free = NULL, *clocks = NULL;
    char *is_done = NULL, *queued = NULL;
    Py_ssize_t *head = NULL, *tail = NULL, *next = NULL, *ready = NULL;
    Link *links = NULL;
    for (; got < N_BUFFERS; got++)
        if (get_buffer(objs[got], &views[got], sizes[got], counts[got], got >= FIRST_OUTPUT, names[got]) < 0)
            goto finally;
    const signed char *lane = views[0].buf;
    const long long *key = views[1].buf, *dep = views[2].buf, *dep2 = views[4].buf, *reload = views[6].buf;
    const double *delay = views[3].buf, *delay2 = views[5].buf, *duration = views[7].buf;
    const long long *offsets = views[8].buf, *engine_of = views[9].buf, *link_of = views[10].buf;
    const double *copy_duration = views[11].buf;
    double *starts = views[12].buf, *ends = views[13].buf, *busies = views[14].buf, *stall = views[15].buf;
    long long *pos = views[16].buf, *wait_key = views[17].buf;

    stalled = PyList_New(0);
    done = PyMem_Calloc(n_keys ? n_keys : 1, sizeof(double));
    is_done = PyMem_Calloc(n_keys ? n_keys : 1, 1);
    head = PyMem_Malloc((n_keys ? n_keys : 1) * sizeof(Py_ssize_t));
    tail = PyMem_Malloc((n_keys ? n_keys : 1) * sizeof(Py_ssize_t));
    next = PyMem_Malloc((n_ranks ? n_ranks : 1) * sizeof(Py_ssize_t));
    ready = PyMem_Malloc((n_ranks ? n_ranks : 1) * sizeof(Py_ssize_t));
    queued = PyMem_Calloc(n_ranks ? n_ranks : 1, 1);
    engine_free = PyMem_Calloc(n_engines ? n_engines : 1, sizeof(double));
    links = PyMem_Calloc(n_links ? n_links : 1, sizeof(Link));
    clocks = PyMem_Calloc(n_ranks ? n_ranks : 1, sizeof(double));
    if (!stalled || !done || !is_done || !head || !tail || !next || !ready || !queued || !engine_free || !links
        || !clocks) {
        PyErr_NoMemory();
        goto finally;
    }
    for (Py_ssize_t k = 0; k < n_keys; k++) head[k] = -1;
    Py_ssize_t n_ready = 0;
    for (Py_ssize_t r = 0; r < n_ranks; r++) {
        ready[n_ready++] = r;
        queued[r] = 1;
        pos[r] = offsets[r];
        wait_key[r] = -1;
        busies[r] = 0.0;
        stall[r] = 0.0;
    }
#define WAIT_ON(k)                                                   \
    do {                                                             \
        wait_key[rank] = (k);                                        \
        next[rank] = -1;                                             \
        if (head[k] < 0) head[k] = rank; else next[tail[k]] = rank;  \
        tail[k] = rank;                                              \
    } while (0)
    while (n_ready) {
        Py_ssize_t rank = ready[--n_ready];
        queued[rank] = 0;
        Py_ssize_t i = pos[rank], stop = offsets[rank + 1];
        double clock = clocks[rank], busy = busies[rank];
        while (i < stop) {
            long long k = key[i];
            int l = lane[i];
            if (l == LANE_SEND) {
                starts[i] = ends[i] = done[k] = clock;
                is_done[k] = 1;
            } else if (l == LANE_COPY) {
                long long d = dep[i];
                double at = (!is_done[d] || clock >= done[d]) ? clock : done[d];
                long long e = engine_of[i];
                double length = copy_duration[i];
                if (engine_free[e] > at) at = engine_free[e];
                double start = at;
                if (length > 0 && link_reserve(&links[link_of[i]], at, length, &start) < 0) {
                    PyErr_NoMemory();
                    goto finally;
                }
                starts[i] = start;
                ends[i] = done[k] = start + length;
                is_done[k] = 1;
                engine_free[e] = start + length;
            } else {
                double at = clock;
                long long d = dep[i];
                if (d >= 0) {
                    if (!is_done[d]) { WAIT_ON(d); break; }
                    if (done[d] + delay[i] > at) at = done[d] + delay[i];
                    long long d2 = dep2[i];
                    if (d2 >= 0) {
                        if (!is_done[d2]) { WAIT_ON(d2); break; }
                        if (done[d2] + delay2[i] > at) at = done[d2] + delay2[i];
                    }
                }
                if (l == LANE_COMPUTE) {
                    double start = at;
                    long long rl = reload[i];
                    if (rl >= 0 && is_done[rl]) {
                        double reload_end = done[rl];
                        if (reload_end > start + STALL_TOL * (start > 1.0 ? start : 1.0)) {
                            PyObject *entry = Py_BuildValue("(nd)", i, reload_end - start);
                            if (!entry || PyList_Append(stalled, entry) < 0) {
                                Py_XDECREF(entry);
                                goto finally;
                            }
                            Py_DECREF(entry);
                            stall[rank] += reload_end - start;
                            start = reload_end;
                        }
                    }
                    clock = start + duration[i];
                    busy += duration[i];
                    starts[i] = start;
                } else { /* a receive waits from the lane's clock until the data arrives */
                    starts[i] = clock;
                    clock = at;
                }
                ends[i] = done[k] = clock;
                is_done[k] = 1;
            }
            i += 1;
            for (Py_ssize_t w = head[k]; w >= 0; w = next[w]) {
                wait_key[w] = -1;
                if (!queued[w]) {
                    queued[w] = 1;
                    ready[n_ready++] = w;
                }
            }
            head[k] = -1;
        }
        pos[rank] = i;
        clocks[rank] = clock;
        busies[rank] = busy;
    }
#undef WAIT_ON
    result = stalled;
    stalled = NULL;
finally:
    for (int b = 0; b < got; b++) PyBuffer_Release(&views[b]);
    Py_XDECREF(stalled);
    if (links)
        for (Py_ssize_t j = 0; j < n_links; j++) {
            PyMem_Free(links[j].starts);
            PyMem_Free(links[j].ends);
        }
    PyMem_Free(links);
    PyMem_Free(done);
    PyMem_Free(is_done);
    PyMem_Free(head);
    PyMem_Free(tail);
    PyMem_Free(next);
    PyMem_Free(ready);
    PyMem_Free(queued);
    PyMem_Free(engine_free);
    PyMem_Free(clocks);
    return result;
}

static PyMethodDef methods[] = {
    {"earliest", earliest, METH_VARARGS, "CopyGroup.earliest on plain lists (see copy_plan.py)."},
    {"latest", latest, METH_VARARGS, "CopyGroup.latest on plain lists (see copy_plan.py)."},
    {"place", place, METH_VARARGS, "CopyGroup.place on lanes (see copy_plan.py)."},
    {"pack", pack, METH_VARARGS, "CopyGroup.pack on arrays (see copy_plan.py)."},
    {"simulate", simulate, METH_VARARGS, "The simulator's event loop on arrays (see simulator.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pipeoffload._native",
                                    "Compiled inner loops of the pure core (optional).", -1, methods};

#ifndef PIPEOFFLOAD_SOURCE_DIGEST
#define PIPEOFFLOAD_SOURCE_DIGEST "unknown"
#endif

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    /* the SHA-256 of the _native.c it was built from: native.py ignores a build from another source */
    if (m && PyModule_AddStringConstant(m, "SOURCE_DIGEST", PIPEOFFLOAD_SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
