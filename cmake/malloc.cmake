# meshsim's executables allocate through jemalloc (Debian's libjemalloc-dev) where it is found: a
# run makes many small libtorch objects per op and rank, and glibc's malloc and free were a fifth
# of a property run's samples (docs/performance.md, "Allocator"). The libraries (meshsim_api and
# the others a project links) leave the allocator to the program that links them.
# meshsim_malloc: an interface target the executables link; empty with the option off, under the
# sanitizers (their own allocator) or where jemalloc is missing.
option(MESHSIM_JEMALLOC "Link meshsim's executables with jemalloc where it is found" ON)
add_library(meshsim_malloc INTERFACE)
set(MESHSIM_MALLOC "glibc")
if(MESHSIM_JEMALLOC AND NOT MESHSIM_SANITIZE AND NOT MESHSIM_FUZZ)
  find_library(MESHSIM_JEMALLOC_LIBRARY NAMES jemalloc)
  if(MESHSIM_JEMALLOC_LIBRARY)
    # --no-as-needed: nothing calls jemalloc by name; it replaces malloc by coming first.
    target_link_libraries(meshsim_malloc INTERFACE "-Wl,--push-state,--no-as-needed" "${MESHSIM_JEMALLOC_LIBRARY}"
                                                   "-Wl,--pop-state")
    set(MESHSIM_MALLOC "jemalloc")
  else()
    message(STATUS "meshsim: jemalloc not found (libjemalloc-dev); the executables use glibc's malloc")
  endif()
endif()
message(STATUS "meshsim: allocator ${MESHSIM_MALLOC}")
