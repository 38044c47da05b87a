/* liboffgraph.so holds every object of the static library (linked whole);
 * a shared library needs one source of its own, and this is it. */
typedef int og_shared_library_unit;
