// The baseline of compile_time.sh: a plain C++ file of the size of one_call.cpp, using the standard
// library as a small program does.
#include <cstdio>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::vector<float> v(static_cast<std::size_t>(argc) * 4, 1.0f);
  std::span<float> s(v);
  float sum = 0;
  for (float x : s) sum += x;
  const std::string name = argc > 0 ? argv[0] : "";
  std::printf("%s %zu %g\n", name.c_str(), s.size(), static_cast<double>(sum));
  return 0;
}
