/* A tiny C extension: 64-bit FNV-1a of a bytes-like object.
 * It exists so that the example job has one dependency built from source (as flash-attn or apex
 * are in real jobs): the setup compiles it, and a snapshot restore saves that compile. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *fnv1a64(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    for (Py_ssize_t i = 0; i < view.len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"fnv1a64", fnv1a64, METH_VARARGS, "64-bit FNV-1a digest of a bytes-like object."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "bsexample_fnv", NULL, -1, methods};

PyMODINIT_FUNC PyInit_bsexample_fnv(void) { return PyModule_Create(&module); }
