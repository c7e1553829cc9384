// A fresh directory under the system temp dir, removed with everything in it
// at destruction: the one TempDir every test folder uses.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace troupe::test_support {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "troupe-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string Ipc(const std::string& name) const { return "ipc://" + path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace troupe::test_support
