// The dashboard page's files, embedded in the binary at build time
// (cmake/EmbedFiles.cmake writes web_assets.cc from launcher/web/ and the
// installed uPlot), so `troupe` serves the page offline from anywhere.
#pragma once

#include <cstddef>

namespace troupe::launcher {

struct WebAsset {
  const char* path;          // URL path, e.g. "/app.js"
  const char* content_type;  // e.g. "text/javascript; charset=utf-8"
  const unsigned char* data;
  size_t size;
  bool missing;  // the file was absent at build time (data is an explanation, served as 503)
};

extern const WebAsset kWebAssets[];
extern const size_t kWebAssetCount;

}  // namespace troupe::launcher
