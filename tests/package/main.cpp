// Links against the installed qmesh package and checks one FP8 round trip.
#include <qmesh/fp8.h>
#include <qmesh/version.h>

#include <cstdio>

int main() {
  const float x = 3.0f;
  const float back = qmesh::e4m3_to_float(qmesh::float_to_e4m3(x));
  std::printf("%s: e4m3 round trip of %g gives %g\n", qmesh::build_info().c_str(), x, back);
  return back == x ? 0 : 1;
}
