// A complete infermux client in C++17 with cppzmq and nlohmann/json, written
// from docs/protocol.md: a REQ socket, one sample request per sample model.
//
//   g++ -std=c++17 -O2 client.cpp -o infermux-client $(pkg-config --cflags --libs libzmq)
//   ./infermux-client [ENDPOINT]
//
// ENDPOINT defaults to the packaged daemon's ipc:///run/infermux/infer.sock.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

using json = nlohmann::json;

static const int kTimeoutMs = 5000;

struct Sample {
    const char* model;
    const char* input;
    std::vector<int64_t> shape;
};

// x[i] = (i % 17) / 16: the same sample in every example client, exact in float32.
// Raw float32 bytes as this machine holds them: the wire is little-endian, as
// every machine infermux runs on (x86-64, aarch64) is.
static std::string sample_bytes(const std::vector<int64_t>& shape) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    std::vector<float> x(count);
    for (int64_t i = 0; i < count; i++) x[i] = static_cast<float>(i % 17) / 16.0f;
    return std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
}

// "probs float32[1,10], top class 4 (0.130362)": the output's entry with its frame.
static std::string describe(const json& meta, const zmq::message_t& frame) {
    std::string text = meta["name"].get<std::string>() + " " + meta["dtype"].get<std::string>() + "[";
    for (size_t i = 0; i < meta["shape"].size(); i++) text += (i ? "," : "") + meta["shape"][i].dump();
    text += "]";
    if (meta["dtype"] != "float32" || frame.size() < sizeof(float)) return text;
    std::vector<float> y(frame.size() / sizeof(float));
    std::memcpy(y.data(), frame.data(), y.size() * sizeof(float));  // a frame need not be aligned
    size_t top = 0;
    for (size_t k = 1; k < y.size(); k++) if (y[k] > y[top]) top = k;
    char tail[64];
    std::snprintf(tail, sizeof tail, ", top class %zu (%.6g)", top, y[top]);
    return text + tail;
}

// One request on a fresh REQ socket (REQ cannot send again after a timeout).
// 0: served; 1: refused (the reply says why); 2: no reply at all.
static int ask(zmq::context_t& ctx, const std::string& endpoint, const Sample& s, int id) {
    zmq::socket_t sock(ctx, zmq::socket_type::req);
    sock.set(zmq::sockopt::linger, 0);
    sock.set(zmq::sockopt::rcvtimeo, kTimeoutMs);  // a daemon that is down never answers
    sock.connect(endpoint);
    json header = {{"model", s.model}, {"id", id}, {"timeout_ms", 5000},
                   {"inputs", {{{"name", s.input}, {"dtype", "float32"}, {"shape", s.shape}}}}};
    std::vector<zmq::message_t> request;  // REQ adds the empty delimiter itself
    request.emplace_back(header.dump());
    request.emplace_back(sample_bytes(s.shape));
    zmq::send_multipart(sock, request);
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(sock, std::back_inserter(reply))) {
        std::fprintf(stderr, "no reply from %s within %d ms: is infermux running there?\n", endpoint.c_str(),
                     kTimeoutMs);
        return 2;
    }
    json head = json::parse(reply[0].to_string());
    if (head["status"] != 200) {
        std::printf("%s: status %d: %s\n", s.model, head["status"].get<int>(), head["error"].get<std::string>().c_str());
        return 1;
    }
    std::string outputs;
    size_t frame = 1;  // frame i belongs to the i-th output entry without a "region"
    for (const json& meta : head["outputs"]) {
        if (meta.contains("region") || frame >= reply.size()) continue;
        outputs += (outputs.empty() ? "" : "; ") + describe(meta, reply[frame++]);
    }
    std::string served = head.contains("fallback") ? ", fallback from " + head["fallback"]["from"].get<std::string>() : "";
    std::printf("%s: status 200, version %s%s, %s, %lld us in the daemon\n", s.model,
                head["version"].get<std::string>().c_str(), served.c_str(), outputs.c_str(),
                head["timing_us"]["total"].get<long long>());
    return 0;
}

int main(int argc, char** argv) {
    const std::string endpoint = argc > 1 ? argv[1] : "ipc:///run/infermux/infer.sock";
    const Sample samples[] = {{"classifier", "images", {1, 3, 64, 64}}, {"mlp", "features", {1, 256}}};
    zmq::context_t ctx;
    int failed = 0, id = 1;
    try {
        for (const Sample& s : samples) {
            int rc = ask(ctx, endpoint, s, id++);
            if (rc == 2) return 1;  // nobody there: the next request would wait as long for nothing
            failed |= rc;
        }
    } catch (const std::exception& e) {  // zmq::error_t, json::exception
        std::fprintf(stderr, "infermux client: %s\n", e.what());
        return 1;
    }
    return failed;
}
