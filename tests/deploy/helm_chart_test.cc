// The Helm chart (deploy/helm/stagecoach) with a real helm binary: lint and render it for the
// default, CPU, GPU, TLS (mutual TLS and tokens) and monitoring values, parse every rendered
// document and check what matters (probes, GPU resources, selectors against pod labels, Secrets
// mounted and passed as flags, the data volume at --data-dir, NetworkPolicies, ServiceMonitor),
// check that the schema refuses unknown and mistyped values, and run each rendered container's
// command line, with in-pod paths mapped to local files, through the built binaries'
// --check-config. Without helm every test fails and says how to get one.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/test_paths.h"
#include "yaml-cpp/yaml.h"

namespace stagecoach::testing::helm_chart_test {
namespace {

namespace fs = std::filesystem;

constexpr char kRelease[] = "rel";
constexpr char kNamespace[] = "sc-test";
const absl::Duration kHelmTimeout = absl::Seconds(60);

std::string ChartDir() { return STAGECOACH_CHART_DIR; }

bool IsExecutable(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         (st.st_mode & S_IXUSR);
}

// $STAGECOACH_HELM, else `helm` on PATH, else the copy scripts/lib.sh's ensure_helm caches.
std::string FindHelm() {
  if (const char* env = std::getenv("STAGECOACH_HELM"); env && IsExecutable(env)) return env;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      if (IsExecutable(dir + "/helm")) return dir + "/helm";
    }
  }
  std::string cache;
  if (const char* c = std::getenv("STAGECOACH_CACHE")) {
    cache = c;
  } else if (const char* home = std::getenv("HOME")) {
    cache = std::string(home) + "/.cache/stagecoach";
  }
  if (!cache.empty() && IsExecutable(cache + "/helm/helm/helm")) return cache + "/helm/helm/helm";
  return "";
}

void WriteFile(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rendered manifests, indexed by kind.
struct Manifests {
  std::vector<YAML::Node> docs;

  std::vector<YAML::Node> OfKind(const std::string& kind) const {
    std::vector<YAML::Node> out;
    for (const auto& d : docs) {
      if (d["kind"] && d["kind"].as<std::string>() == kind) out.push_back(d);
    }
    return out;
  }
  // The one document of `kind` whose metadata.name is `name` (a null node when absent).
  YAML::Node Get(const std::string& kind, const std::string& name) const {
    for (const auto& d : OfKind(kind)) {
      if (d["metadata"]["name"].as<std::string>() == name) return d;
    }
    return YAML::Node();
  }
};

std::map<std::string, std::string> StringMap(const YAML::Node& node) {
  std::map<std::string, std::string> out;
  if (!node || !node.IsMap()) return out;
  for (const auto& kv : node) out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  return out;
}

// Whether `selector` (matchLabels-style map) selects a pod with `labels`.
bool Selects(const std::map<std::string, std::string>& selector,
             const std::map<std::string, std::string>& labels) {
  if (selector.empty()) return false;
  for (const auto& [k, v] : selector) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

std::vector<std::string> Strings(const YAML::Node& node) {
  std::vector<std::string> out;
  if (node && node.IsSequence()) {
    for (const auto& n : node) out.push_back(n.as<std::string>());
  }
  return out;
}

// The value following `flag` in args ("" when absent).
std::string FlagValue(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) return args[i + 1];
  }
  return "";
}

bool HasFlag(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args) {
    if (a == flag) return true;
  }
  return false;
}

// What the tests expect of a variant.
struct Expect {
  bool gpu = false;
  bool tls = false;
  bool mtls = false;
  bool auth = false;
  bool service_monitor = false;

  Expect& Gpu() { return gpu = true, *this; }
  Expect& TlsMutualTokens() { return tls = mtls = auth = true, *this; }
  Expect& ServiceMonitor() { return service_monitor = true, *this; }
};

class HelmChartTest : public ::testing::Test {
 protected:
  // A CA and one certificate/key for every daemon, and two tokens, shared by the TLS tests.
  static void SetUpTestSuite() {
    pki_ = new TempDir();
    const std::string d = pki_->path();
    const auto openssl = [&](std::vector<std::string> args) {
      args.insert(args.begin(), "openssl");
      CommandResult r = RunCommand(
          {"/usr/bin/env", "sh", "-c", "cd '" + d + "' && exec " + absl::StrJoin(args, " ")},
          absl::Seconds(30));
      pki_error_ += r.exit_code == 0 ? "" : absl::StrCat(absl::StrJoin(args, " "), ": ", r.err);
    };
    openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-days", "2", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=test-ca", "-addext",
             "basicConstraints=critical,CA:TRUE", "-addext",
             "keyUsage=critical,keyCertSign,cRLSign"});
    openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=stagecoach"});
    WriteFile(d + "/server.ext",
              absl::StrCat("subjectAltName=DNS:", kRelease, "-stagecoach-coordinator,DNS:*.",
                           kRelease, "-stagecoach-workers.", kNamespace,
                           ".svc.cluster.local\nextendedKeyUsage=serverAuth,clientAuth\n"));
    openssl({"x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem"});
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  void SetUp() override {
    helm_ = FindHelm();
    ASSERT_FALSE(helm_.empty())
        << "no helm binary: these tests need Helm 3. Set STAGECOACH_HELM to one, put `helm` on "
           "PATH, or fetch one with `source scripts/lib.sh && ensure_helm` (scripts/test.sh "
           "does that; it caches helm under ~/.cache/stagecoach/helm)";
  }

  // A values file for TLS with mutual TLS and both tokens, the PEMs inline.
  std::string TlsValuesFile() {
    EXPECT_EQ(pki_error_, "") << "openssl failed";
    const std::string d = pki_->path();
    YAML::Emitter e;
    e << YAML::BeginMap << YAML::Key << "tls" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "enabled" << YAML::Value << true;
    e << YAML::Key << "requireClientCert" << YAML::Value << true;
    e << YAML::Key << "cert" << YAML::Value << YAML::Literal << ReadFile(d + "/server.pem");
    e << YAML::Key << "key" << YAML::Value << YAML::Literal << ReadFile(d + "/server.key");
    e << YAML::Key << "ca" << YAML::Value << YAML::Literal << ReadFile(d + "/ca.pem");
    e << YAML::EndMap << YAML::Key << "auth" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "enabled" << YAML::Value << true;
    e << YAML::Key << "clientToken" << YAML::Value << "client-secret-0123456789";
    e << YAML::Key << "workerToken" << YAML::Value << "worker-secret-9876543210";
    e << YAML::EndMap << YAML::EndMap;
    const std::string path = work_.path() + "/values-tls.yaml";
    WriteFile(path, e.c_str());
    return path;
  }

  CommandResult Helm(std::vector<std::string> args) {
    args.insert(args.begin(), helm_);
    return RunCommand(args, kHelmTimeout);
  }

  // helm lint and helm template with `values_args` (-f FILE / --set K=V); the parsed documents.
  Manifests LintAndRender(const std::vector<std::string>& values_args,
                          const std::string& chart = ChartDir()) {
    std::vector<std::string> lint = {"lint", chart, "--strict", "--namespace", kNamespace};
    lint.insert(lint.end(), values_args.begin(), values_args.end());
    CommandResult l = Helm(lint);
    EXPECT_EQ(l.exit_code, 0) << "helm lint " << absl::StrJoin(values_args, " ") << ":\n"
                              << l.out << l.err;
    std::vector<std::string> tmpl = {"template", kRelease, chart, "--namespace", kNamespace};
    tmpl.insert(tmpl.end(), values_args.begin(), values_args.end());
    CommandResult t = Helm(tmpl);
    EXPECT_EQ(t.exit_code, 0) << "helm template " << absl::StrJoin(values_args, " ") << ":\n"
                              << t.err;
    Manifests m;
    try {
      for (const auto& doc : YAML::LoadAll(t.out)) {
        if (doc.IsMap()) m.docs.push_back(doc);
      }
    } catch (const YAML::Exception& e) {
      ADD_FAILURE() << "rendered manifests are not YAML: " << e.what();
    }
    return m;
  }

  static std::string Fullname() { return absl::StrCat(kRelease, "-stagecoach"); }

  // Every check on one variant's manifests.
  void CheckManifests(const Manifests& m, const Expect& x) {
    const std::string coord_name = Fullname() + "-coordinator";
    const std::string worker_name = Fullname() + "-worker";
    const std::string headless_name = Fullname() + "-workers";
    YAML::Node deploy = m.Get("Deployment", coord_name);
    YAML::Node sts = m.Get("StatefulSet", worker_name);
    ASSERT_TRUE(deploy) << "no Deployment " << coord_name;
    ASSERT_TRUE(sts) << "no StatefulSet " << worker_name;
    ASSERT_EQ(m.OfKind("Deployment").size(), 1u);
    ASSERT_EQ(m.OfKind("StatefulSet").size(), 1u);

    const auto coord_labels = StringMap(deploy["spec"]["template"]["metadata"]["labels"]);
    const auto worker_labels = StringMap(sts["spec"]["template"]["metadata"]["labels"]);
    EXPECT_EQ(coord_labels.at("app.kubernetes.io/component"), "coordinator");
    EXPECT_EQ(worker_labels.at("app.kubernetes.io/component"), "worker");
    EXPECT_EQ(coord_labels.at("app.kubernetes.io/instance"), kRelease);
    EXPECT_EQ(worker_labels.at("app.kubernetes.io/name"), "stagecoach");
    // Workload selectors select their own pods and not the other component's.
    const auto deploy_sel = StringMap(deploy["spec"]["selector"]["matchLabels"]);
    const auto sts_sel = StringMap(sts["spec"]["selector"]["matchLabels"]);
    EXPECT_TRUE(Selects(deploy_sel, coord_labels));
    EXPECT_FALSE(Selects(deploy_sel, worker_labels));
    EXPECT_TRUE(Selects(sts_sel, worker_labels));
    EXPECT_FALSE(Selects(sts_sel, coord_labels));

    const YAML::Node coord_pod = deploy["spec"]["template"]["spec"];
    const YAML::Node worker_pod = sts["spec"]["template"]["spec"];
    ASSERT_EQ(coord_pod["containers"].size(), 1u);
    ASSERT_EQ(worker_pod["containers"].size(), 1u);
    const YAML::Node coord_c = coord_pod["containers"][0];
    const YAML::Node worker_c = worker_pod["containers"][0];

    // Non-root.
    for (const YAML::Node& pod : {coord_pod, worker_pod}) {
      EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>());
      EXPECT_GT(pod["securityContext"]["runAsUser"].as<int>(), 0);
    }
    for (const YAML::Node& c : {coord_c, worker_c}) {
      EXPECT_FALSE(c["securityContext"]["allowPrivilegeEscalation"].as<bool>());
      EXPECT_TRUE(c["securityContext"]["runAsNonRoot"].as<bool>());
    }

    // Ports by name, and gRPC health probes: on the gRPC port, or with TLS on the plaintext
    // health port (--health-listen), since kubelet's gRPC probes cannot speak TLS.
    std::map<std::string, int> coord_ports, worker_ports;
    for (const auto& p : coord_c["ports"]) {
      coord_ports[p["name"].as<std::string>()] = p["containerPort"].as<int>();
    }
    for (const auto& p : worker_c["ports"]) {
      worker_ports[p["name"].as<std::string>()] = p["containerPort"].as<int>();
    }
    ASSERT_TRUE(coord_ports.count("grpc") && worker_ports.count("grpc"));
    EXPECT_EQ(coord_ports.count("health") + worker_ports.count("health"), x.tls ? 2u : 0u);
    for (const auto& [c, probe_port] :
         {std::pair{coord_c, coord_ports[x.tls ? "health" : "grpc"]},
          std::pair{worker_c, worker_ports[x.tls ? "health" : "grpc"]}}) {
      for (const char* probe : {"livenessProbe", "readinessProbe"}) {
        SCOPED_TRACE(absl::StrCat(c["name"].as<std::string>(), " ", probe));
        const YAML::Node p = c[probe];
        ASSERT_TRUE(p) << "missing";
        ASSERT_TRUE(p["grpc"]) << "not a gRPC probe";
        EXPECT_EQ(p["grpc"]["port"].as<int>(), probe_port);
      }
    }
    // GPU requests and limits only in the GPU variant, on the workers only; --device matches.
    const YAML::Node res = worker_c["resources"];
    if (x.gpu) {
      ASSERT_TRUE(res["limits"]["nvidia.com/gpu"]) << "GPU limit missing";
      ASSERT_TRUE(res["requests"]["nvidia.com/gpu"]) << "GPU request missing";
      EXPECT_GE(res["limits"]["nvidia.com/gpu"].as<int>(), 1);
      EXPECT_EQ(res["limits"]["nvidia.com/gpu"].as<int>(),
                res["requests"]["nvidia.com/gpu"].as<int>());
    } else {
      EXPECT_FALSE(res && res["limits"] && res["limits"]["nvidia.com/gpu"]);
      EXPECT_FALSE(res && res["requests"] && res["requests"]["nvidia.com/gpu"]);
    }
    EXPECT_FALSE(coord_c["resources"] && coord_c["resources"]["limits"] &&
                 coord_c["resources"]["limits"]["nvidia.com/gpu"]);
    YAML::Node cm = m.Get("ConfigMap", Fullname() + "-config");
    ASSERT_TRUE(cm) << "no ConfigMap";
    const YAML::Node worker_cfg = YAML::Load(cm["data"]["worker.yaml"].as<std::string>());
    EXPECT_EQ(worker_cfg["device"].as<std::string>(), x.gpu ? "cuda" : "cpu");
    // With TLS the daemons answer the probes' plaintext health checks on the health port.
    const YAML::Node coord_cfg = YAML::Load(cm["data"]["coordinator.yaml"].as<std::string>());
    if (x.tls) {
      EXPECT_EQ(coord_cfg["health-listen"].as<std::string>(),
                absl::StrCat("0.0.0.0:", coord_ports["health"]));
      EXPECT_EQ(worker_cfg["health-listen"].as<std::string>(),
                absl::StrCat("0.0.0.0:", worker_ports["health"]));
    } else {
      EXPECT_FALSE(coord_cfg["health-listen"]);
      EXPECT_FALSE(worker_cfg["health-listen"]);
    }
    EXPECT_EQ(
        worker_cfg["coordinator"].as<std::string>(),
        absl::StrCat(coord_name, ".", kNamespace, ".svc.cluster.local:", coord_ports["grpc"]));

    // Services: the coordinator's selects the coordinator pod; the headless one the workers and
    // is the StatefulSet's serviceName; target ports name container ports.
    YAML::Node coord_svc = m.Get("Service", coord_name);
    YAML::Node worker_svc = m.Get("Service", headless_name);
    ASSERT_TRUE(coord_svc && worker_svc);
    EXPECT_TRUE(Selects(StringMap(coord_svc["spec"]["selector"]), coord_labels));
    EXPECT_FALSE(Selects(StringMap(coord_svc["spec"]["selector"]), worker_labels));
    EXPECT_TRUE(Selects(StringMap(worker_svc["spec"]["selector"]), worker_labels));
    EXPECT_FALSE(Selects(StringMap(worker_svc["spec"]["selector"]), coord_labels));
    EXPECT_EQ(worker_svc["spec"]["clusterIP"].as<std::string>(), "None");
    EXPECT_EQ(sts["spec"]["serviceName"].as<std::string>(), headless_name);
    for (const auto& [svc, ports] :
         {std::pair{coord_svc, coord_ports}, std::pair{worker_svc, worker_ports}}) {
      std::set<std::string> names;
      for (const auto& p : svc["spec"]["ports"]) {
        names.insert(p["name"].as<std::string>());
        EXPECT_TRUE(ports.count(p["targetPort"].as<std::string>()))
            << "Service port targets unknown container port " << p["targetPort"];
      }
      EXPECT_TRUE(names.count("grpc"));
      EXPECT_TRUE(names.count("metrics"));
    }
    EXPECT_EQ(coord_svc["spec"]["ports"][0]["port"].as<int>(), coord_ports["grpc"]);

    // The worker advertises its stable name through the headless Service.
    const auto worker_args = Strings(worker_c["args"]);
    const auto coord_args = Strings(coord_c["args"]);
    EXPECT_EQ(FlagValue(worker_args, "--advertise-host"),
              absl::StrCat("$(POD_NAME).", headless_name, ".", kNamespace, ".svc.cluster.local"));

    // PodDisruptionBudgets select the pods of their component.
    ASSERT_FALSE(m.OfKind("PodDisruptionBudget").empty());
    for (const auto& pdb : m.OfKind("PodDisruptionBudget")) {
      const auto sel = StringMap(pdb["spec"]["selector"]["matchLabels"]);
      const bool coord = Selects(sel, coord_labels), worker = Selects(sel, worker_labels);
      EXPECT_TRUE(coord != worker) << "PDB " << pdb["metadata"]["name"] << " selects "
                                   << (coord ? "both components" : "no pods");
    }
    EXPECT_TRUE(m.Get("PodDisruptionBudget", worker_name));

    // The data volume: a rendered PVC, mounted at --data-dir.
    const std::string data_dir = FlagValue(coord_args, "--data-dir");
    ASSERT_FALSE(data_dir.empty()) << "coordinator without --data-dir";
    std::string data_volume;
    for (const auto& vm : coord_c["volumeMounts"]) {
      if (vm["mountPath"].as<std::string>() == data_dir) data_volume = vm["name"].as<std::string>();
    }
    ASSERT_FALSE(data_volume.empty()) << "nothing mounted at --data-dir " << data_dir;
    bool claimed = false;
    for (const auto& v : coord_pod["volumes"]) {
      if (v["name"].as<std::string>() != data_volume) continue;
      ASSERT_TRUE(v["persistentVolumeClaim"]) << "--data-dir is not on a PVC";
      const std::string claim = v["persistentVolumeClaim"]["claimName"].as<std::string>();
      EXPECT_TRUE(m.Get("PersistentVolumeClaim", claim)) << "PVC " << claim << " not rendered";
      claimed = true;
    }
    EXPECT_TRUE(claimed);

    // TLS and tokens: flags present iff enabled, and each file lies in a mounted Secret that
    // holds that key.
    std::vector<std::pair<YAML::Node, std::vector<std::string>>> secret_flags = {{coord_c, {}},
                                                                                 {worker_c, {}}};
    if (x.tls) {
      for (auto& entry : secret_flags) entry.second = {"--tls-cert", "--tls-key", "--tls-ca"};
    }
    if (x.auth) {
      secret_flags[0].second.push_back("--client-token-file");
      secret_flags[0].second.push_back("--worker-token-file");
      secret_flags[1].second.push_back("--coordinator-token-file");
    }
    EXPECT_EQ(HasFlag(coord_args, "--tls-require-client-cert"), x.mtls);
    EXPECT_EQ(HasFlag(worker_args, "--tls-require-client-cert"), x.mtls);
    for (const char* f : {"--tls-cert", "--client-token-file", "--worker-token-file"}) {
      EXPECT_EQ(HasFlag(coord_args, f), std::string(f) == "--tls-cert" ? x.tls : x.auth) << f;
    }
    EXPECT_EQ(HasFlag(worker_args, "--coordinator-token-file"), x.auth);
    for (const auto& [c, flags] : secret_flags) {
      const YAML::Node pod = c["name"].as<std::string>() == "coordinator" ? coord_pod : worker_pod;
      const auto args = Strings(c["args"]);
      for (const auto& flag : flags) {
        SCOPED_TRACE(absl::StrCat(c["name"].as<std::string>(), " ", flag));
        const std::string file = FlagValue(args, flag);
        ASSERT_FALSE(file.empty()) << "flag missing";
        const std::string dir = fs::path(file).parent_path().string();
        const std::string base = fs::path(file).filename().string();
        std::string volume;
        for (const auto& vm : c["volumeMounts"]) {
          if (vm["mountPath"].as<std::string>() == dir) volume = vm["name"].as<std::string>();
        }
        ASSERT_FALSE(volume.empty()) << "nothing mounted at " << dir;
        for (const auto& v : pod["volumes"]) {
          if (v["name"].as<std::string>() != volume) continue;
          ASSERT_TRUE(v["secret"]) << "volume " << volume << " is not a Secret";
          std::string key;
          for (const auto& item : v["secret"]["items"]) {
            if (item["path"].as<std::string>() == base) key = item["key"].as<std::string>();
          }
          ASSERT_FALSE(key.empty()) << "secret volume has no item " << base;
          YAML::Node secret = m.Get("Secret", v["secret"]["secretName"].as<std::string>());
          ASSERT_TRUE(secret) << "Secret " << v["secret"]["secretName"] << " not rendered";
          EXPECT_TRUE(secret["data"][key]) << "Secret lacks key " << key;
        }
      }
    }
    if (!x.tls && !x.auth) {
      EXPECT_TRUE(m.OfKind("Secret").empty());
    }

    CheckNetworkPolicies(m, coord_labels, worker_labels, coord_ports, worker_ports);

    // ServiceMonitor only when asked for; it selects both Services and scrapes "metrics".
    const auto monitors = m.OfKind("ServiceMonitor");
    EXPECT_EQ(monitors.size(), x.service_monitor ? 1u : 0u);
    for (const auto& sm : monitors) {
      const auto sel = StringMap(sm["spec"]["selector"]["matchLabels"]);
      EXPECT_TRUE(Selects(sel, StringMap(coord_svc["metadata"]["labels"])));
      EXPECT_TRUE(Selects(sel, StringMap(worker_svc["metadata"]["labels"])));
      EXPECT_EQ(sm["spec"]["endpoints"][0]["port"].as<std::string>(), "metrics");
    }
  }

  // The peers of a NetworkPolicy rule, as (podSelector labels, has namespaceSelector) pairs.
  static std::vector<YAML::Node> Peers(const YAML::Node& rule, const char* key) {
    std::vector<YAML::Node> out;
    if (rule[key]) {
      for (const auto& p : rule[key]) out.push_back(p);
    }
    return out;
  }
  static std::set<int> Ports(const YAML::Node& rule) {
    std::set<int> out;
    if (rule["ports"]) {
      for (const auto& p : rule["ports"]) out.insert(p["port"].as<int>());
    }
    return out;
  }

  void CheckNetworkPolicies(const Manifests& m, const std::map<std::string, std::string>& coord,
                            const std::map<std::string, std::string>& worker,
                            std::map<std::string, int> coord_ports,
                            std::map<std::string, int> worker_ports) {
    const auto policies = m.OfKind("NetworkPolicy");
    ASSERT_EQ(policies.size(), 2u);
    // Whether a peer is exactly "pods with these labels in this namespace".
    const auto is_pods = [](const YAML::Node& peer, const std::map<std::string, std::string>& l) {
      return peer["podSelector"] && !peer["namespaceSelector"] && !peer["ipBlock"] &&
             Selects(StringMap(peer["podSelector"]["matchLabels"]), l);
    };
    const auto is_scraper = [](const YAML::Node& peer) {
      return StringMap(peer["namespaceSelector"]["matchLabels"]) ==
                 std::map<std::string, std::string>{
                     {"kubernetes.io/metadata.name", "monitoring"}} &&
             StringMap(peer["podSelector"]["matchLabels"]) ==
                 std::map<std::string, std::string>{{"app.kubernetes.io/name", "prometheus"}};
    };
    const auto is_dns = [](const YAML::Node& rule) {
      const auto peers = Peers(rule, "to");
      return peers.size() == 1 && Ports(rule) == std::set<int>{53} &&
             StringMap(peers[0]["podSelector"]["matchLabels"]) ==
                 std::map<std::string, std::string>{{"k8s-app", "kube-dns"}} &&
             peers[0]["namespaceSelector"];
    };
    for (const auto& np : policies) {
      const auto target = StringMap(np["spec"]["podSelector"]["matchLabels"]);
      const bool is_coord = Selects(target, coord);
      ASSERT_NE(is_coord, Selects(target, worker)) << "policy must select one component";
      SCOPED_TRACE(is_coord ? "coordinator NetworkPolicy" : "worker NetworkPolicy");
      EXPECT_EQ(Strings(np["spec"]["policyTypes"]),
                (std::vector<std::string>{"Ingress", "Egress"}));
      const YAML::Node in = np["spec"]["ingress"];
      const YAML::Node out = np["spec"]["egress"];
      ASSERT_TRUE(in && out);
      // Every rule, classified; anything unrecognised fails ("nothing else").
      int seen_ctrl_in = 0, seen_data_in = 0, seen_clients = 0, seen_metrics = 0;
      for (const auto& rule : in) {
        const auto from = Peers(rule, "from");
        const auto ports = Ports(rule);
        if (is_coord && from.size() == 1 && is_pods(from[0], worker) &&
            ports == std::set<int>{coord_ports["grpc"]}) {
          ++seen_ctrl_in;
        } else if (is_coord && from.empty() && ports == std::set<int>{coord_ports["grpc"]}) {
          ++seen_clients;  // stagectl: any source, gRPC port only
        } else if (!is_coord && from.size() == 1 && is_pods(from[0], coord) &&
                   ports == std::set<int>{worker_ports["grpc"]}) {
          ++seen_ctrl_in;
        } else if (!is_coord && from.size() == 1 && is_pods(from[0], worker) && ports.empty()) {
          ++seen_data_in;  // worker<->worker, any port
        } else if (from.size() == 1 && is_scraper(from[0]) &&
                   ports == std::set<int>{(is_coord ? coord_ports : worker_ports)["metrics"]}) {
          ++seen_metrics;
        } else {
          ADD_FAILURE() << "unexpected ingress rule:\n" << YAML::Dump(rule);
        }
      }
      EXPECT_EQ(seen_ctrl_in, 1);
      EXPECT_EQ(seen_metrics, 1);
      EXPECT_EQ(seen_clients, is_coord ? 1 : 0);
      EXPECT_EQ(seen_data_in, is_coord ? 0 : 1);
      int seen_ctrl_out = 0, seen_data_out = 0, seen_dns = 0;
      for (const auto& rule : out) {
        const auto to = Peers(rule, "to");
        const auto ports = Ports(rule);
        if (is_dns(rule)) {
          ++seen_dns;
        } else if (is_coord && to.size() == 1 && is_pods(to[0], worker) &&
                   ports == std::set<int>{worker_ports["grpc"]}) {
          ++seen_ctrl_out;
        } else if (!is_coord && to.size() == 1 && is_pods(to[0], coord) &&
                   ports == std::set<int>{coord_ports["grpc"]}) {
          ++seen_ctrl_out;
        } else if (!is_coord && to.size() == 1 && is_pods(to[0], worker) && ports.empty()) {
          ++seen_data_out;
        } else {
          ADD_FAILURE() << "unexpected egress rule:\n" << YAML::Dump(rule);
        }
      }
      EXPECT_EQ(seen_ctrl_out, 1);
      EXPECT_EQ(seen_dns, 1);
      EXPECT_EQ(seen_data_out, is_coord ? 0 : 1);
    }
  }

  // Runs each rendered container's command line through the built binary with --check-config:
  // the mounted ConfigMap and Secrets are written to local directories named like their mount
  // paths, every argument under a mount path is mapped to the local copy, $(POD_NAME) is the
  // first pod's name. A worker told --device cuda may be refused only because this machine has
  // no CUDA device; then it must pass with device cpu.
  void CheckCommandLines(const Manifests& m) {
    for (const char* kind : {"Deployment", "StatefulSet"}) {
      for (const auto& w : m.OfKind(kind)) {
        const YAML::Node pod = w["spec"]["template"]["spec"];
        for (const auto& c : pod["containers"]) {
          SCOPED_TRACE(absl::StrCat(kind, " ", c["name"].as<std::string>()));
          RunCheckConfig(m, w, pod, c);
        }
      }
    }
  }

  void RunCheckConfig(const Manifests& m, const YAML::Node& workload, const YAML::Node& pod,
                      const YAML::Node& c) {
    const std::string root = absl::StrCat(work_.path(), "/pod-", ++pods_);
    std::map<std::string, std::string> volume_dirs;  // volume name -> local dir
    for (const auto& v : pod["volumes"]) {
      const std::string name = v["name"].as<std::string>();
      const std::string dir = absl::StrCat(root, "/volumes/", name);
      fs::create_directories(dir);
      volume_dirs[name] = dir;
      std::map<std::string, std::string> files;  // key -> content
      YAML::Node items;
      if (v["configMap"]) {
        YAML::Node cm = m.Get("ConfigMap", v["configMap"]["name"].as<std::string>());
        ASSERT_TRUE(cm) << "ConfigMap " << v["configMap"]["name"] << " not rendered";
        files = StringMap(cm["data"]);
        items = v["configMap"]["items"];
      } else if (v["secret"]) {
        YAML::Node s = m.Get("Secret", v["secret"]["secretName"].as<std::string>());
        ASSERT_TRUE(s) << "Secret " << v["secret"]["secretName"] << " not rendered";
        for (const auto& [k, b64] : StringMap(s["data"])) {
          std::string raw;
          ASSERT_TRUE(absl::Base64Unescape(b64, &raw)) << "Secret key " << k << " not base64";
          files[k] = raw;
        }
        items = v["secret"]["items"];
      }
      if (items) {
        for (const auto& item : items) {
          const std::string key = item["key"].as<std::string>();
          ASSERT_TRUE(files.count(key)) << "volume " << name << " wants missing key " << key;
          WriteFile(dir + "/" + item["path"].as<std::string>(), files[key]);
        }
      } else {
        for (const auto& [k, text] : files) WriteFile(dir + "/" + k, text);
      }
    }
    std::vector<std::pair<std::string, std::string>> mounts;  // in-pod path -> local dir
    for (const auto& vm : c["volumeMounts"]) {
      const std::string name = vm["name"].as<std::string>();
      ASSERT_TRUE(volume_dirs.count(name)) << "mount of undeclared volume " << name;
      mounts.emplace_back(vm["mountPath"].as<std::string>(), volume_dirs[name]);
    }
    const auto command = Strings(c["command"]);
    ASSERT_EQ(command.size(), 1u);
    const std::string binary = fs::path(command[0]).filename().string();
    std::string local_binary;
    if (binary == "stagecoach-coordinator") {
      local_binary = BinaryDir() + "/coordinator/stagecoach-coordinator";
    } else if (binary == "stagecoach-worker") {
      local_binary = BinaryDir() + "/worker/stagecoach-worker";
    }
    ASSERT_FALSE(local_binary.empty()) << "unknown binary " << command[0];
    const std::string pod_name = absl::StrCat(workload["metadata"]["name"].as<std::string>(), "-0");
    std::vector<std::string> argv = {local_binary};
    std::string config_path;
    for (std::string a : Strings(c["args"])) {
      a = absl::StrReplaceAll(a, {{"$(POD_NAME)", pod_name}});
      ASSERT_FALSE(absl::StrContains(a, "$(")) << "unexpanded variable in " << a;
      for (const auto& [mount, local] : mounts) {
        if (a == mount || absl::StartsWith(a, mount + "/")) {
          a = local + a.substr(mount.size());
          ASSERT_TRUE(a == local || fs::exists(a)) << "arg names a file the pod lacks: " << a;
          break;
        }
      }
      if (argv.back() == "--config") config_path = a;
      argv.push_back(a);
    }
    ASSERT_FALSE(config_path.empty()) << "no --config";
    argv.push_back("--check-config");
    CommandResult r = RunCommand(argv, absl::Seconds(30));
    const std::string cmd = absl::StrJoin(argv, " ");
    if (r.exit_code != 0 && absl::StrContains(r.err + r.out, "sees no CUDA device")) {
      // A CUDA worker on a machine without one: the only complaint must be the device.
      const std::string cfg = ReadFile(config_path);
      ASSERT_TRUE(absl::StrContains(cfg, "device: cuda")) << cfg;
      WriteFile(config_path, absl::StrReplaceAll(cfg, {{"device: cuda", "device: cpu"}}));
      r = RunCommand(argv, absl::Seconds(30));
    }
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.out << r.err;
    EXPECT_TRUE(absl::StrContains(r.out + r.err, "configuration ok")) << cmd << "\n" << r.out;
  }

  std::string helm_;
  TempDir work_;
  int pods_ = 0;
  static TempDir* pki_;
  static std::string pki_error_;
};

TempDir* HelmChartTest::pki_ = nullptr;
std::string HelmChartTest::pki_error_;

TEST_F(HelmChartTest, DefaultValues) {
  Manifests m = LintAndRender({});
  CheckManifests(m, Expect{});
  CheckCommandLines(m);
}

TEST_F(HelmChartTest, CpuClusterExample) {
  Manifests m = LintAndRender({"-f", ConfigsDir() + "/helm/values-cpu.yaml"});
  CheckManifests(m, Expect().ServiceMonitor());
  CheckCommandLines(m);
}

TEST_F(HelmChartTest, GpuClusterExample) {
  Manifests m = LintAndRender({"-f", ConfigsDir() + "/helm/values-gpu.yaml"});
  CheckManifests(m, Expect().Gpu());
  YAML::Node sts = m.Get("StatefulSet", Fullname() + "-worker");
  ASSERT_TRUE(sts);
  const YAML::Node pod = sts["spec"]["template"]["spec"];
  EXPECT_EQ(pod["nodeSelector"]["nvidia.com/gpu.present"].as<std::string>(), "true");
  EXPECT_EQ(pod["tolerations"][0]["key"].as<std::string>(), "nvidia.com/gpu");
  EXPECT_EQ(sts["spec"]["replicas"].as<int>(), 4);
  EXPECT_TRUE(
      m.Get("Deployment",
            Fullname() + "-coordinator")["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]);
  CheckCommandLines(m);
}

TEST_F(HelmChartTest, TlsMutualAndTokens) {
  Manifests m = LintAndRender({"-f", TlsValuesFile()});
  CheckManifests(m, Expect().TlsMutualTokens());
  CheckCommandLines(m);
}

TEST_F(HelmChartTest, TlsFromExistingSecrets) {
  // Secrets made outside the chart: none rendered, the named ones mounted.
  Manifests m =
      LintAndRender({"--set", "tls.enabled=true", "--set", "tls.existingSecret=my-tls", "--set",
                     "auth.enabled=true", "--set", "auth.existingSecret=my-tokens"});
  EXPECT_TRUE(m.OfKind("Secret").empty());
  std::set<std::string> mounted;
  for (const char* kind : {"Deployment", "StatefulSet"}) {
    for (const auto& w : m.OfKind(kind)) {
      for (const auto& v : w["spec"]["template"]["spec"]["volumes"]) {
        if (v["secret"]) mounted.insert(v["secret"]["secretName"].as<std::string>());
      }
    }
  }
  EXPECT_EQ(mounted, (std::set<std::string>{"my-tls", "my-tokens"}));
}

TEST_F(HelmChartTest, Monitoring) {
  Manifests m = LintAndRender({"--set", "metrics.serviceMonitor.enabled=true"});
  CheckManifests(m, Expect().ServiceMonitor());
  // metrics-listen in both config files, on the metrics ports.
  YAML::Node cm = m.Get("ConfigMap", Fullname() + "-config");
  ASSERT_TRUE(cm);
  EXPECT_EQ(YAML::Load(cm["data"]["coordinator.yaml"].as<std::string>())["metrics-listen"]
                .as<std::string>(),
            "0.0.0.0:9090");
  EXPECT_EQ(
      YAML::Load(cm["data"]["worker.yaml"].as<std::string>())["metrics-listen"].as<std::string>(),
      "0.0.0.0:9091");
  EXPECT_TRUE(m.OfKind("PrometheusRule").empty()) << "the alerts are off by default";
}

// metrics.prometheusRule: a PrometheusRule whose groups are files/alerts.yaml's as they are (its
// {{ $value }} templates left to Prometheus), with the extra labels.
TEST_F(HelmChartTest, AlertsAsAPrometheusRule) {
  Manifests m = LintAndRender({"--set", "metrics.prometheusRule.enabled=true", "--set",
                               "metrics.prometheusRule.labels.release=kube-prometheus"});
  const auto rules = m.OfKind("PrometheusRule");
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0]["metadata"]["labels"]["release"].as<std::string>(), "kube-prometheus");
  const YAML::Node file = YAML::LoadFile(ChartDir() + "/files/alerts.yaml");
  EXPECT_EQ(YAML::Dump(rules[0]["spec"]["groups"]), YAML::Dump(file["groups"]));
  std::set<std::string> alerts;
  for (const auto& rule : rules[0]["spec"]["groups"][0]["rules"]) {
    alerts.insert(rule["alert"].as<std::string>());
    EXPECT_NE(rule["annotations"]["summary"].as<std::string>().find("{{"), std::string::npos)
        << "Helm expanded the alert's own template";
  }
  EXPECT_EQ(alerts, (std::set<std::string>{"StagecoachJobStalled", "StagecoachRankStraggling",
                                           "StagecoachWorkerLost", "StagecoachStepsSkipped",
                                           "StagecoachGradReductionExposed",
                                           "StagecoachJobDegraded", "StagecoachJobsRestarting"}));
}

TEST_F(HelmChartTest, SchemaRefusesUnknownAndMistypedValues) {
  struct Case {
    std::vector<std::string> args;
    std::string names;  // what the error must name
  };
  const std::vector<Case> cases = {
      {{"--set", "bogus=1"}, "bogus"},
      {{"--set", "worker.replicas=abc"}, "worker.replicas"},
      {{"--set", "worker.replicas=0"}, "worker.replicas"},
      {{"--set", "worker.gpu.enabled=maybe"}, "worker.gpu.enabled"},
      {{"--set", "coordinator.logLevel=loud"}, "coordinator.logLevel"},
      {{"--set", "coordinator.ports.grpc=70000"}, "coordinator.ports.grpc"},
      {{"--set", "worker.gpu.typo=1"}, "typo"},
      {{"--set", "coordinator.lease=ten"}, "coordinator.lease"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"template", kRelease, ChartDir()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    CommandResult r = Helm(args);
    EXPECT_NE(r.exit_code, 0) << absl::StrJoin(c.args, " ") << " was accepted";
    EXPECT_TRUE(absl::StrContains(r.err, c.names))
        << absl::StrJoin(c.args, " ") << ": error does not name " << c.names << ":\n"
        << r.err;
  }
  // TLS without certificates and without an existing Secret is refused, naming the value.
  CommandResult r = Helm({"template", kRelease, ChartDir(), "--set", "tls.enabled=true"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(r.err, "tls.cert")) << r.err;
}

TEST_F(HelmChartTest, NotesTellHowToReachTheCoordinator) {
  // helm renders NOTES.txt only on install; a copy of the chart renders it as a document.
  const std::string chart = work_.path() + "/chart";
  fs::copy(ChartDir(), chart, fs::copy_options::recursive);
  WriteFile(chart + "/templates/_test_notes.tpl", "{{- define \"test.notes\" -}}\n" +
                                                      ReadFile(chart + "/templates/NOTES.txt") +
                                                      "\n{{- end }}\n");
  WriteFile(chart + "/templates/test-notes.yaml",
            "kind: TestNotes\nnotes: {{ include \"test.notes\" . | toJson }}\n");
  const auto notes = [&](const std::vector<std::string>& values) {
    std::vector<std::string> args = {"template",
                                     kRelease,
                                     chart,
                                     "--namespace",
                                     kNamespace,
                                     "--show-only",
                                     "templates/test-notes.yaml"};
    args.insert(args.end(), values.begin(), values.end());
    CommandResult r = Helm(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? YAML::Load(r.out)["notes"].as<std::string>() : std::string();
  };
  const std::string plain = notes({});
  EXPECT_TRUE(absl::StrContains(
      plain, absl::StrCat("port-forward svc/", Fullname(), "-coordinator 7070:7070")))
      << plain;
  EXPECT_TRUE(absl::StrContains(plain, "stagectl --coordinator localhost:7070 list")) << plain;
  EXPECT_FALSE(absl::StrContains(plain, "--tls-ca")) << plain;
  const std::string secure = notes({"--set", "tls.enabled=true", "--set", "tls.existingSecret=t",
                                    "--set", "tls.requireClientCert=true", "--set",
                                    "auth.enabled=true", "--set", "auth.existingSecret=a"});
  for (const char* flag : {"--tls-ca", "--tls-cert", "--tls-key", "--token-file"}) {
    EXPECT_TRUE(absl::StrContains(secure, flag)) << flag << " missing from:\n" << secure;
  }
}

}  // namespace
}  // namespace stagecoach::testing::helm_chart_test
