/* Python bindings of the PoC verifier's AVX-512 kernels (the C files under simd/).
 *
 *   leaf_hashes(c, n, pair, first_row, out)      RFC 6962 leaf hashes of C's rows (commit.py's
 *                                                 leaf encoding: 0x00 | u32le pair | u32le row |
 *                                                 the row as little-endian int32)
 *   check_rows(c, n, pair, first_row, columns, k, leaves, products) -> (min, max)
 *                                                 the leaf hashes, the smallest and largest entry
 *                                                 and C.R for k columns of R, in one pass
 *   rows_dot(x, n, m, bound, columns, k, out)     V.R where V's entries are the generator's
 *                                                 bytes mapped to ((x*m) >> 8) - bound, or, with
 *                                                 m = 0, the bytes themselves as int8
 *   aes_rows_dot(key, n, start, stop, m, bound, columns, k, out)
 *                                                 V.R for rows start:stop of an aes256ctr matrix,
 *                                                 its keystream made on the fly
 *   merkle_root(leaves) -> bytes                  the RFC 6962 root over >= 1 leaf hashes
 *   available(), aes_available() -> bool          whether this CPU runs the above (AVX-512 F, BW,
 *                                                 VL, DQ; aes_rows_dot also VAES and AES-NI)
 *
 * Dot products run in float64 and are exact while every partial sum is an integer below
 * 2^53 in magnitude: the caller picks R's range for that (verifier.freivalds_bits). Every
 * function checks its buffers' sizes, releases the GIL while it computes, and raises
 * RuntimeError where the CPU cannot run it. The Python side (kernels.py) falls back to
 * hashlib, cryptography and numpy there, with the same results.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "simd/simd.h"

/* check_rows hashes this many rows, then reads them again for C.R while they are in cache. */
#define GROUP 16

static int usable = 0, aes_usable = 0;

static int require(void) {
    if (!usable) PyErr_SetString(PyExc_RuntimeError, "this CPU has no AVX-512: use the hashlib/numpy path");
    return usable;
}

static int check_size(Py_buffer *buf, Py_ssize_t want, const char *what) {
    if (buf->len != want) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, expected %zd", what, buf->len, want);
        return 0;
    }
    return 1;
}

static int check_dims(Py_ssize_t n, Py_ssize_t k) {
    if (n <= 0 || n > (1 << 24) || k < 0 || k > 8) {
        PyErr_SetString(PyExc_ValueError, "n must be in 1..2^24 and k in 0..8");
        return 0;
    }
    return 1;
}

static PyObject *py_available(PyObject *self, PyObject *unused) { return PyBool_FromLong(usable); }

static PyObject *py_aes_available(PyObject *self, PyObject *unused) { return PyBool_FromLong(aes_usable); }

static PyObject *py_leaf_hashes(PyObject *self, PyObject *args) {
    Py_buffer c, out;
    Py_ssize_t n;
    unsigned int pair, first;
    if (!PyArg_ParseTuple(args, "y*nIIw*", &c, &n, &pair, &first, &out)) return NULL;
    PyObject *result = NULL;
    if (!require() || !check_dims(n, 0) || c.len % (4 * n) != 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "c is not a whole number of rows");
        goto done;
    }
    Py_ssize_t rows = c.len / (4 * n);
    if (!check_size(&out, rows * 32, "out")) goto done;
#if PW_SIMD
    if (rows > 0) {
        Py_BEGIN_ALLOW_THREADS;
        pw_leaf_hashes((const uint8_t *)c.buf, (size_t)(4 * n), pair, first, (size_t)rows, (uint8_t *)out.buf);
        Py_END_ALLOW_THREADS;
    }
#endif
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&c);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *py_check_rows(PyObject *self, PyObject *args) {
    Py_buffer c, cols, leaves, products;
    Py_ssize_t n, k;
    unsigned int pair, first;
    if (!PyArg_ParseTuple(args, "y*nIIy*nw*w*", &c, &n, &pair, &first, &cols, &k, &leaves, &products)) return NULL;
    PyObject *result = NULL;
    if (!require() || !check_dims(n, k) || c.len % (4 * n) != 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "c is not a whole number of rows");
        goto done;
    }
    Py_ssize_t rows = c.len / (4 * n);
    if (!check_size(&cols, 8 * k * n, "columns") || !check_size(&leaves, rows * 32, "leaves") ||
        !check_size(&products, 8 * k * rows, "products"))
        goto done;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
#if PW_SIMD
    Py_BEGIN_ALLOW_THREADS;
    const int32_t *cc = (const int32_t *)c.buf;
    /* Sixteen rows at a time: hashed, then read again for the products while still in cache. */
    for (Py_ssize_t r0 = 0; r0 < rows; r0 += GROUP) {
        Py_ssize_t group = rows - r0 < GROUP ? rows - r0 : GROUP;
        pw_leaf_hashes((const uint8_t *)(cc + r0 * n), (size_t)(4 * n), pair, first + (uint32_t)r0, (size_t)group,
                   (uint8_t *)leaves.buf + 32 * r0);
        pw_int32_rows_dot(cc + r0 * n, (size_t)group, (size_t)n, (const double *)cols.buf, (size_t)k,
                       (double *)products.buf + r0 * k, &lo, &hi);
    }
    Py_END_ALLOW_THREADS;
#endif
    result = Py_BuildValue("(ii)", (int)lo, (int)hi);
done:
    PyBuffer_Release(&c);
    PyBuffer_Release(&cols);
    PyBuffer_Release(&leaves);
    PyBuffer_Release(&products);
    return result;
}

static PyObject *py_rows_dot(PyObject *self, PyObject *args) {
    Py_buffer x, cols, out;
    Py_ssize_t n, k;
    int m, bound;
    if (!PyArg_ParseTuple(args, "y*niiy*nw*", &x, &n, &m, &bound, &cols, &k, &out)) return NULL;
    PyObject *result = NULL;
    if (!require() || !check_dims(n, k) || x.len % n != 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "x is not a whole number of rows");
        goto done;
    }
    if (m < 0 || m > 255 || bound < 0 || bound > 127) {
        PyErr_SetString(PyExc_ValueError, "m must be in 0..255 and bound in 0..127");
        goto done;
    }
    Py_ssize_t rows = x.len / n;
    if (!check_size(&cols, 8 * k * n, "columns") || !check_size(&out, 8 * k * rows, "out")) goto done;
#if PW_SIMD
    Py_BEGIN_ALLOW_THREADS;
    if (k > 0 && rows > 0)
        pw_byte_rows_dot((const uint8_t *)x.buf, (size_t)rows, (size_t)n, m, bound, (const double *)cols.buf, (size_t)k,
                      (double *)out.buf);
    Py_END_ALLOW_THREADS;
#endif
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&x);
    PyBuffer_Release(&cols);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *py_aes_rows_dot(PyObject *self, PyObject *args) {
    Py_buffer key, cols, out;
    Py_ssize_t n, start, stop, k;
    int m, bound;
    if (!PyArg_ParseTuple(args, "y*nnniiy*nw*", &key, &n, &start, &stop, &m, &bound, &cols, &k, &out)) return NULL;
    PyObject *result = NULL;
    if (!aes_usable) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU has no VAES: use cryptography's keystream");
        goto done;
    }
    if (!check_dims(n, k) || !check_size(&key, 32, "key")) goto done;
    if (k < 1 || m < 1 || m > 255 || bound < 0 || bound > 127) {
        PyErr_SetString(PyExc_ValueError, "k must be in 1..8, m in 1..255 and bound in 0..127");
        goto done;
    }
    if (start < 0 || stop < start || stop > n || (unsigned long long)n * (unsigned long long)n > (1ULL << 32)) {
        PyErr_SetString(PyExc_ValueError, "rows start:stop must lie in 0..n, and n*n within 2^32 bytes");
        goto done;
    }
    if (!check_size(&cols, 8 * k * n, "columns") || !check_size(&out, 8 * k * (stop - start), "out")) goto done;
    int failed = 0;
#if PW_SIMD
    Py_BEGIN_ALLOW_THREADS;
    failed = pw_aes_rows_dot((const uint8_t *)key.buf, (size_t)n, (size_t)start, (size_t)stop, m, bound,
                             (const double *)cols.buf, (size_t)k, (double *)out.buf);
    Py_END_ALLOW_THREADS;
#endif
    result = failed ? PyErr_NoMemory() : Py_NewRef(Py_None);
done:
    PyBuffer_Release(&key);
    PyBuffer_Release(&cols);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *py_merkle_root(PyObject *self, PyObject *args) {
    Py_buffer leaves;
    if (!PyArg_ParseTuple(args, "y*", &leaves)) return NULL;
    PyObject *result = NULL;
    if (!require()) goto done;
    if (leaves.len == 0 || leaves.len % 32 != 0) {
        PyErr_SetString(PyExc_ValueError, "leaves must be one or more 32-byte hashes");
        goto done;
    }
    uint8_t root[32];
    uint8_t *scratch = PyMem_RawMalloc((size_t)leaves.len);
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
#if PW_SIMD
    Py_BEGIN_ALLOW_THREADS;
    pw_merkle_root((const uint8_t *)leaves.buf, (size_t)leaves.len / 32, scratch, root);
    Py_END_ALLOW_THREADS;
#endif
    PyMem_RawFree(scratch);
    result = PyBytes_FromStringAndSize((const char *)root, 32);
done:
    PyBuffer_Release(&leaves);
    return result;
}

static PyMethodDef methods[] = {
    {"available", py_available, METH_NOARGS, "Whether this CPU runs these kernels (AVX-512 F, BW, VL, DQ)."},
    {"leaf_hashes", py_leaf_hashes, METH_VARARGS, "leaf_hashes(c, n, pair, first_row, out): RFC 6962 leaf hashes."},
    {"check_rows", py_check_rows, METH_VARARGS,
     "check_rows(c, n, pair, first_row, columns, k, leaves, products) -> (min, max)."},
    {"rows_dot", py_rows_dot, METH_VARARGS, "rows_dot(x, n, m, bound, columns, k, out): mapped bytes times columns."},
    {"aes_available", py_aes_available, METH_NOARGS, "Whether this CPU also runs aes_rows_dot (VAES, AES-NI)."},
    {"aes_rows_dot", py_aes_rows_dot, METH_VARARGS,
     "aes_rows_dot(key, n, start, stop, m, bound, columns, k, out): V.R from AES-256-CTR rows."},
    {"merkle_root", py_merkle_root, METH_VARARGS, "merkle_root(leaves) -> bytes: RFC 6962 root of >= 1 leaves."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_simd", "AVX-512 kernels of the PoC verifier.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__simd(void) {
    usable = pw_simd_available();
    aes_usable = usable && pw_aes_available();
    return PyModule_Create(&module);
}
