// Symbol visibility: qmesh libraries are built with hidden visibility; QMESH_API marks the
// public API that a shared libqmesh*.so exports.
#pragma once

#define QMESH_API __attribute__((visibility("default")))
